package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// VLLM captures through vLLM's extract_hidden_states speculative method
// with a hidden-states connector (docs/engines.md §15): a completion whose
// prompt is the token ids and max_tokens 1, as speculators' vllm_client
// sends it. The answer names the file in its top-level
// kv_transfer_params.hidden_states_path and, with return_token_ids, the
// prompt ids in choices[0].prompt_token_ids. The connector writes the
// file after answering, holding flock(LOCK_EX) on <path>.lock meanwhile;
// Capture waits for that lock before it returns.
type VLLM struct {
	URL    string // server root
	Model  string // "" sends none: the server takes the model it serves
	APIKey string
	HTTP   *http.Client
	// FileWait bounds the wait for the connector's write to end; past it
	// the capture fails with KindSlow. Zero means one minute.
	FileWait time.Duration
}

type completionRequest struct {
	Model          string  `json:"model,omitempty"`
	Prompt         []int64 `json:"prompt"`
	MaxTokens      int     `json:"max_tokens"`
	ReturnTokenIDs bool    `json:"return_token_ids"`
}

type completionResponse struct {
	Choices []struct {
		PromptTokenIDs []int64 `json:"prompt_token_ids"`
	} `json:"choices"`
	KVTransferParams *struct {
		HiddenStatesPath string `json:"hidden_states_path"`
	} `json:"kv_transfer_params"`
}

// Capture sends r's ids and returns the finished file the server names.
func (v *VLLM) Capture(ctx context.Context, r Request) (Result, error) {
	body, _ := json.Marshal(completionRequest{Model: v.Model, Prompt: r.InputIDs, MaxTokens: 1, ReturnTokenIDs: true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return Result{}, &ServerError{Endpoint: v.URL, Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if v.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+v.APIKey)
	}
	hc := v.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		return Result{}, &ServerError{Endpoint: v.URL, Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return Result{}, &ServerError{Endpoint: v.URL, Err: fmt.Errorf("read answer: %w", err)}
	}
	if err := statusError(v.URL, resp.StatusCode, raw); err != nil {
		return Result{}, err
	}
	res, err := v.parse(raw)
	if err != nil {
		return Result{}, err
	}
	var named error
	if r.Named != nil {
		named = r.Named(res.Path)
	}
	if err := waitWritten(ctx, res.Path, cmpDur(v.FileWait, time.Minute)); err != nil {
		return res, err
	}
	return res, named
}

// statusError classifies a non-2xx answer: a request the server refuses
// (400, 413, 422: too long, malformed) is the key's own; the rest (5xx,
// 401/403/404: a key, model or route the server does not know, 429) is the
// server's.
func statusError(url string, status int, body []byte) error {
	if status/100 == 2 {
		return nil
	}
	msg := fmt.Sprintf("HTTP %d: %s", status, snippet(body))
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return &FileError{Kind: KindRequest, Detail: msg}
	}
	return &ServerError{Endpoint: url, Err: errors.New(msg)}
}

// parse reads the answer; one that names no file, or gives no prompt ids,
// comes from a server not set up for capture: the server's failure.
func (v *VLLM) parse(raw []byte) (Result, error) {
	var cr completionResponse
	if err := json.Unmarshal(raw, &cr); err != nil {
		return Result{}, &ServerError{Endpoint: v.URL, Err: fmt.Errorf("answer is not a completion: %v: %s", err, snippet(raw))}
	}
	if cr.KVTransferParams == nil || cr.KVTransferParams.HiddenStatesPath == "" {
		return Result{}, &ServerError{Endpoint: v.URL, Err: errors.New("the answer names no kv_transfer_params.hidden_states_path: " +
			"is the server running the extract_hidden_states speculative method with a hidden-states connector?")}
	}
	if len(cr.Choices) == 0 || cr.Choices[0].PromptTokenIDs == nil {
		return Result{}, &ServerError{Endpoint: v.URL, Err: errors.New("the answer carries no choices[0].prompt_token_ids (return_token_ids): the prompt ids cannot be checked")}
	}
	path := cr.KVTransferParams.HiddenStatesPath
	return Result{Path: path, PromptIDs: cr.Choices[0].PromptTokenIDs, Leftovers: []string{path + ".lock"}}, nil
}

// waitWritten waits until the connector's lock on path is free (no lock
// file: nothing to wait for), polling a shared lock as vLLM's own reader
// takes it, for at most wait.
func waitWritten(ctx context.Context, path string, wait time.Duration) error {
	lock, err := os.Open(path + ".lock")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wait for %s: %w", path, err)
	}
	defer lock.Close()
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(lock.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return unix.Flock(int(lock.Fd()), unix.LOCK_UN)
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("wait for %s: lock: %w", path, err)
		}
		if time.Now().After(deadline) {
			return &FileError{Path: path, Kind: KindSlow, Detail: fmt.Sprintf("still being written after %s (the server holds %s.lock)", wait, path)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func cmpDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
