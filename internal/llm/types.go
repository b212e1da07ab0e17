package llm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Request is one chat completion to send.
type Request struct {
	Model string
	// Body is the sample's request content, a JSON object with "messages"
	// and optionally "tools"; its keys are copied into the request body.
	Body json.RawMessage
	// Members, when set, are Body's top-level members, split by whoever
	// built Body, with compact values (as encoding/json writes them): the
	// client takes them instead of walking Body, whose history grows with
	// every turn of a conversation. Body is then not read, and may be nil
	// (a member in Pieces has no Body that holds it in one slice).
	Members   []Member
	MaxTokens int
	// Params are generation settings merged at the top level of the body
	// (temperature, top_p, chat_template_kwargs, any engine extra); they win
	// over Body's keys. model, stream, stream_options and max_tokens are set
	// by the client.
	Params map[string]json.RawMessage
	// TokenIDFields are sent as true beside Config.TokenIDFields: the
	// fields of the engine the server turned out to be (detected after the
	// client was built), so the caller names them per request.
	TokenIDFields []string
	// Priority, when not nil, is sent as the request's "priority" (SGLang
	// with --enable-priority-scheduling, vLLM with --scheduling-policy
	// priority; a vLLM server without it refuses any value but 0).
	Priority *int
	// RoutingKey, when not empty, is sent as the X-SMG-Routing-Key header:
	// SGLang's model gateway routes requests with the same key to the same
	// worker (consistent_hashing and manual policies), and SGLang's OpenAI
	// routes pass it to the scheduler as the request's routing_key.
	RoutingKey string
}

// Member is one top-level member of a request body (Request.Members).
type Member struct {
	Key   string
	Value json.RawMessage
	// Pieces, when Value is nil, are the value's bytes in order, sent as
	// they are: a conversation's history goes on from turn to turn without
	// being copied into one slice (conversation.Plan.NextParts).
	Pieces [][]byte
}

// Bytes is the member's value in one slice: Value, or Pieces joined.
func (m Member) Bytes() json.RawMessage {
	if m.Value != nil || m.Pieces == nil {
		return m.Value
	}
	return bytes.Join(m.Pieces, nil)
}

// Usage is the server-reported token accounting.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CachedTokens     int `json:"cached_tokens,omitempty"`
	ReasoningTokens  int `json:"reasoning_tokens,omitempty"`
}

// ToolCall is one assembled tool call from the stream.
type ToolCall struct {
	ID       string `json:"id,omitempty"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Result is a finished completion.
type Result struct {
	Content string `json:"content"`
	// ContentJSON, when set, stands for Content (then empty): the JSON
	// string rawjson.AppendString writes for it, copied from a stored
	// answer (reply.DecodeHistoryQuoted) for a request built from the
	// store, which sends it without decoding and quoting it again
	// (conversation.Answer).
	ContentJSON      []byte     `json:"-"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	FinishReason     string     `json:"finish_reason"`
	Usage            Usage      `json:"usage"`
	Model            string     `json:"model,omitempty"`
	// SystemFingerprint is the response's system_fingerprint, when the
	// server sent one.
	SystemFingerprint string        `json:"system_fingerprint,omitempty"`
	TTFT              time.Duration `json:"ttft_ns"`
	Duration          time.Duration `json:"duration_ns"`
	// PromptTokenIDs and CompletionTokenIDs are the token ids the server
	// saw and sampled, when it was asked for them (Config.TokenIDFields)
	// and returned them; regen never makes them from text.
	PromptTokenIDs     []int32 `json:"prompt_token_ids,omitempty"`
	CompletionTokenIDs []int32 `json:"completion_token_ids,omitempty"`
	// TokenIDsUnavailable, when not empty, says why the ids above are not
	// to be trained on although the server returned them (a check after
	// the answer found them wrong: dispatch's render check); the export
	// treats the turn as one without ids, with this reason.
	TokenIDsUnavailable string `json:"token_ids_unavailable,omitempty"`
}

// Class says what the caller should do about an error.
type Class int

const (
	// Retryable: try again later, spending an attempt (500 and other 5xx
	// from a live engine, a mid-stream server error, a stream past its budget).
	Retryable Class = iota + 1
	// ServerDown: the endpoint is unreachable, dying or hung; pause it and requeue
	// without spending an attempt (connection refused/reset, 502/503/504, timeouts, idle stream).
	ServerDown
	// BadRequest: the request can never succeed (400, 413, 422, context too long); dead-letter it.
	BadRequest
	// Malformed: the server answered with something that is not a valid
	// completion (broken SSE/JSON); retry, spending an attempt.
	Malformed
	// Backpressure: the endpoint is alive but asks for less load (429, or 503
	// with Retry-After); wait RetryAfter, lower that endpoint's load, and
	// requeue without spending an attempt.
	Backpressure
)

func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case ServerDown:
		return "server-down"
	case BadRequest:
		return "bad-request"
	case Malformed:
		return "malformed"
	case Backpressure:
		return "backpressure"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// Error is a classified client error.
type Error struct {
	Class  Class
	Status int    // HTTP status, 0 when none
	Msg    string // short description, with the server's message when it sent one
	Err    error  // underlying error, may be nil
	// RetryAfter is the server's Retry-After, 0 when it sent none.
	RetryAfter time.Duration
	// InStream: the server sent the error as a data event inside a 200
	// stream (llama-server, vLLM and SGLang do for errors met while
	// generating), not as an HTTP status.
	InStream bool
	// EndpointFault: the error describes the endpoint, not the request:
	// a 200 that is not an event stream (a web page, a whole JSON body,
	// nothing) or no response headers at all. A wrong URL or a broken
	// server, never the sample's fault.
	EndpointFault bool
}

func (e *Error) Error() string {
	s := e.Class.String()
	if e.Status != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the class of err, or Retryable when err is not an *Error
// (an unknown failure is worth another attempt, not a dead letter).
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return Retryable
}
