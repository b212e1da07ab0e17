package capture

import (
	"context"
	"errors"
	"fmt"
)

// Request is one capture: the row's key (for messages) and the exact
// token ids whose hidden states are wanted.
type Request struct {
	Key      string
	InputIDs []int64
	// Named, when set, is told the server's file as soon as the answer
	// names it, before the wait for the write (the caller notes it in the
	// store, so a kill from then on leaves the file to the key's next
	// holder). Its error ends the capture once the write has ended: the
	// file is then complete, for the caller to remove.
	Named func(path string) error
}

// Result is a capture server's answer: the file it wrote (complete: the
// client waited for the write to end), the prompt ids it says it used,
// and files of its own to remove once the capture is settled (the
// connector's lock file).
type Result struct {
	Path      string
	PromptIDs []int64
	Leftovers []string
}

// Client is one capture server's contract (vLLM's extract_hidden_states
// with its hidden-states connector: VLLM). Capture returns a *ServerError
// for a failure of the server (spends no attempt) and a *FileError for
// one of the request's own (spends one); any other error is the server's.
type Client interface {
	Capture(ctx context.Context, r Request) (Result, error)
}

// Kinds of a key's own failure beyond CheckFile's.
const (
	KindPromptIDs = "prompt_ids" // the answer's prompt ids differ from the ids sent
	KindRequest   = "request"    // the server refused this request (4xx)
	KindSlow      = "slow"       // the file was still being written when the wait ended
)

// ServerError is a capture server's failure (unreachable, 5xx, an answer
// naming no file): the endpoint backs off and the key is tried again
// without spending an attempt.
type ServerError struct {
	Endpoint string
	Err      error
}

func (e *ServerError) Error() string { return fmt.Sprintf("capture server %s: %v", e.Endpoint, e.Err) }
func (e *ServerError) Unwrap() error { return e.Err }

// ownError returns err's *FileError when the failure is the key's own.
func ownError(err error) (*FileError, bool) {
	var fe *FileError
	if errors.As(err, &fe) {
		return fe, true
	}
	return nil, false
}
