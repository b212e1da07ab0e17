package llm

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// classifyStatus maps a non-200 HTTP answer to what the dispatcher should
// do. msg is the server's message, which decides the 4xx codes not listed.
func classifyStatus(status int, msg string) Class {
	switch {
	case status == 502, status == 503, status == 504:
		return ServerDown
	case status == 401, status == 403, status == 404:
		// A key, a model name or a URL path the server does not know is the
		// endpoint's problem, not the sample's: pause the endpoint rather than
		// dead-letter every sample of the job through it (a wrong model name
		// on vLLM answers 404 to every request).
		return ServerDown
	case status == 408, status == 429:
		return Retryable
	case status == 400, status == 413, status == 422:
		return BadRequest
	case status >= 400 && status < 500:
		if mentionsContextLength(msg) {
			return BadRequest
		}
		return Retryable
	}
	// 500 and the rest of 5xx. A dead engine's HTTP front end keeps
	// answering 500 until the process exits (vLLM for about 5 s after
	// EngineDeadError): that is an outage, which must not spend the
	// attempt of every sample claimed meanwhile.
	if mentionsEngineDeath(msg) {
		return ServerDown
	}
	// Otherwise the engine answered, so it is alive.
	return Retryable
}

// classifyEventCode classifies an error object sent in a 200 stream (or a
// 200 JSON body), whose code is an HTTP-like status or 0 when absent.
func classifyEventCode(code int, msg string) Class {
	switch {
	case (code == 0 || code >= 500) && mentionsEngineDeath(msg):
		// vLLM ends every in-flight stream this way when its engine dies.
		return ServerDown
	case code == 408, code == 429:
		return Retryable
	case code >= 400 && code < 500:
		return BadRequest
	case mentionsContextLength(msg):
		return BadRequest
	}
	return Retryable
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

// parseErrorBody extracts the message and numeric code from the error
// shapes OpenAI-compatible servers send: {"error":{"message","code"}},
// {"error":"text"}, SGLang/vLLM's {"object":"error","message","code"},
// FastAPI's {"detail":...}, or plain text.
func parseErrorBody(b []byte) (msg string, code int) {
	var top struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(b, &top) != nil {
		return clip(b, errBodyLimit), 0
	}
	var codeText string
	switch e := bytes.TrimSpace(top.Error); {
	case len(e) > 0 && e[0] == '{':
		var inner struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		}
		if json.Unmarshal(e, &inner) == nil {
			msg, code, codeText = inner.Message, numericCode(inner.Code), textCode(inner.Code)
			if msg == "" {
				msg = inner.Type
			}
		}
	case len(e) > 0 && e[0] == '"':
		_ = json.Unmarshal(e, &msg)
	}
	if msg == "" && top.Message != "" {
		msg, code, codeText = top.Message, numericCode(top.Code), textCode(top.Code)
	}
	if msg == "" && len(top.Detail) > 0 {
		if json.Unmarshal(top.Detail, &msg) != nil {
			msg = clip(top.Detail, errBodyLimit)
		}
	}
	if msg == "" {
		return clip(b, errBodyLimit), code
	}
	// OpenAI-style string codes (context_length_exceeded) carry meaning.
	if codeText != "" && !strings.Contains(msg, codeText) {
		msg = codeText + ": " + msg
	}
	return msg, code
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
