package llm

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// apiError is the error object a server sent, in a response body or as an
// event inside a 200 stream.
type apiError struct {
	Msg  string
	Code int // numeric code (an HTTP-like status), 0 when none
	// Type and CodeText are the structured kind: the object's
	// "type" (llama-server's invalid_request_error, vLLM's BadRequestError)
	// and its non-numeric "code" (OpenAI's context_length_exceeded).
	Type, CodeText string
}

// kind is the class the structured kind names, the code first (it is the
// more specific: OpenAI's rate limit has type "requests"); 0 for none.
func (e apiError) kind() Class {
	if c := kindClass(e.CodeText); c != 0 {
		return c
	}
	return kindClass(e.Type)
}

// Class decisions go status code first, then the structured type; words
// in the message only refine a 4xx (is it the prompt's length?) and mark a
// dead engine behind a 5xx or a code-less event. A message never turns a
// server error into a bad request: "KV cache usage exceeds the pool" with
// code 500 is the server's trouble, not the request's.

// classifyStatus maps a non-200 HTTP answer to what the dispatcher should
// do. retryAfter says whether the answer carried a usable Retry-After.
func classifyStatus(status int, retryAfter bool, e apiError) Class {
	switch {
	case status == http.StatusTooManyRequests:
		return Backpressure
	case status == http.StatusServiceUnavailable && retryAfter:
		// A server that says when to come back is alive and shedding load
		// (RFC 9110 §15.6.4); without the header 503 is an outage.
		return Backpressure
	case status == 502, status == 503, status == 504:
		return ServerDown
	case status == 401, status == 403, status == 404:
		// A key, a model name or a URL path the server does not know is the
		// endpoint's problem, not the sample's: pause the endpoint rather than
		// dead-letter every sample of the job through it (a wrong model name
		// on vLLM answers 404 to every request).
		return ServerDown
	case status == 408:
		return Retryable
	case status == 400, status == 413, status == 422:
		return BadRequest
	case status >= 400 && status < 500:
		if e.kind() == BadRequest || mentionsContextLength(e.Msg) {
			return BadRequest
		}
		return Retryable
	}
	// 500 and the rest of 5xx. A dead engine's HTTP front end keeps
	// answering 500 until the process exits (vLLM for about 5 s after
	// EngineDeadError): that is an outage, which must not spend the
	// attempt of every sample claimed meanwhile.
	if mentionsEngineDeath(e.Msg) {
		return ServerDown
	}
	// Otherwise the engine answered, so it is alive.
	return Retryable
}

// classifyEvent classifies an error object sent in a 200 stream (or a 200
// JSON body), whose code is an HTTP-like status or 0 when absent.
func classifyEvent(e apiError) Class {
	switch code := e.Code; {
	case (code == 0 || code >= 500) && mentionsEngineDeath(e.Msg):
		// vLLM ends every in-flight stream this way when its engine dies.
		return ServerDown
	case code == http.StatusTooManyRequests:
		return Backpressure
	case code == 408:
		return Retryable
	case code >= 400 && code < 500:
		return BadRequest
	case code >= 500:
		return Retryable
	}
	// No usable code: the structured type decides, and a server error is
	// the default (worth another attempt, not a dead letter).
	if c := e.kind(); c != 0 {
		return c
	}
	return Retryable
}

// kindClass maps the structured error types engines send (llama-server's
// format_error_response, vLLM's and SGLang's ErrorResponse, OpenAI's
// codes) to a class; 0 when the type says nothing.
func kindClass(kind string) Class {
	switch strings.ToLower(kind) {
	case "invalid_request_error", "invalid_request", "badrequesterror",
		"exceed_context_size_error", "context_length_exceeded":
		return BadRequest
	case "rate_limit_error", "ratelimiterror", "rate_limit_exceeded", "too_many_requests":
		return Backpressure
	case "server_error", "internalservererror", "unavailable_error", "serviceunavailableerror":
		return Retryable
	}
	return 0
}

// maxRetryAfter bounds a Retry-After so that an absurd value cannot
// overflow a Duration; how long to really wait is the dispatcher's call.
const maxRetryAfter = 24 * time.Hour

// retryAfter reads a Retry-After header (RFC 9110 §10.2.3): delay-seconds
// (1*DIGIT) or an HTTP-date, taken relative to the response's Date when it
// has one, so the two clocks need not agree. ok is false when the header
// is absent or is neither form; a date in the past is 0 and ok.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter, true // all digits, too many of them
		}
		return time.Duration(n) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		now = date
	}
	return min(max(at.Sub(now), 0), maxRetryAfter), true
}

// contextPhrases are how SGLang, vLLM and llama-server say a prompt does not
// fit the model.
var contextPhrases = []string{
	"maximum context length",
	"context length",
	"context_length",
	"too long",
	"exceeds",
}

// enginePhrases are how vLLM (EngineDeadError, its v0 AsyncEngineDeadError)
// and SGLang (a scheduler exception, then SIGQUIT to the parent) say the
// engine behind the HTTP server is dead, in error bodies and stream events.
var enginePhrases = []string{
	"enginedead",
	"enginecore encountered",
	"engine is dead",
	"engine loop is not running",
	"background loop has errored",
	"scheduler hit an exception",
	"sigquit",
}

func mentionsEngineDeath(msg string) bool {
	m := strings.ToLower(msg)
	for _, p := range enginePhrases {
		if strings.Contains(m, p) {
			return true
		}
	}
	return false
}

func mentionsContextLength(msg string) bool {
	m := strings.ToLower(msg)
	for _, p := range contextPhrases {
		if strings.Contains(m, p) {
			return true
		}
	}
	return false
}

// parseErrorBody extracts the message, numeric code and structured type
// from the error shapes OpenAI-compatible servers send:
// {"error":{"message","type","code"}}, {"error":"text"}, SGLang/vLLM's
// {"object":"error","message","type","code"}, FastAPI's {"detail":...}, or
// plain text.
func parseErrorBody(b []byte) apiError {
	var top struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(b, &top) != nil {
		return apiError{Msg: clip(b, errBodyLimit)}
	}
	var out apiError
	switch e := bytes.TrimSpace(top.Error); {
	case len(e) > 0 && e[0] == '{':
		var inner struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		}
		if json.Unmarshal(e, &inner) == nil {
			out = apiError{Msg: inner.Message, Code: numericCode(inner.Code), Type: inner.Type, CodeText: textCode(inner.Code)}
			if out.Msg == "" {
				out.Msg = inner.Type
			}
		}
	case len(e) > 0 && e[0] == '"':
		_ = json.Unmarshal(e, &out.Msg)
	}
	if out.Msg == "" && top.Message != "" {
		out = apiError{Msg: top.Message, Code: numericCode(top.Code), Type: top.Type, CodeText: textCode(top.Code)}
	}
	if out.Msg == "" && len(top.Detail) > 0 {
		if json.Unmarshal(top.Detail, &out.Msg) != nil {
			out.Msg = clip(top.Detail, errBodyLimit)
		}
	}
	if out.Msg == "" {
		out.Msg = clip(b, errBodyLimit)
		return out
	}
	// OpenAI-style string codes (context_length_exceeded) carry meaning.
	if c := out.CodeText; c != "" && !strings.Contains(out.Msg, c) {
		out.Msg = c + ": " + out.Msg
	}
	return out
}

func numericCode(raw json.RawMessage) int {
	s := strings.Trim(string(bytes.TrimSpace(raw)), `"`)
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0
	}
	return n
}

// textCode returns a code that is a non-numeric string, else "".
func textCode(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil || s == "" {
		return ""
	}
	if _, err := strconv.Atoi(s); err == nil {
		return ""
	}
	return s
}
