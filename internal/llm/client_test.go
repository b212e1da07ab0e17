package llm

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func toolCall(id, name, args string) ToolCall {
	var tc ToolCall
	tc.ID, tc.Type = id, "function"
	tc.Function.Name, tc.Function.Arguments = name, args
	return tc
}

func TestChatStreams(t *testing.T) {
	tests := []struct {
		fixture    string
		want       Result
		wantDeltas int
	}{
		{
			fixture: "sglang_plain.sse",
			want: Result{
				Content:      "Hello, world! <b>&</b> é中 \"quoted\"\\n",
				FinishReason: "stop",
				Usage:        Usage{PromptTokens: 21, CompletionTokens: 6, TotalTokens: 27},
				Model:        "kimi-k2.5",
			},
			wantDeltas: 5,
		},
		{
			fixture: "sglang_reasoning_tools.sse",
			want: Result{
				ReasoningContent: "The user wants the weather.",
				ToolCalls: []ToolCall{
					toolCall("call_a1", "get_weather", `{"city": "Paris"}`),
					toolCall("call_b2", "get_time", `{"tz": "CET"}`),
				},
				FinishReason: "tool_calls",
				Usage:        Usage{PromptTokens: 120, CompletionTokens: 50, TotalTokens: 170, CachedTokens: 64, ReasoningTokens: 12},
				Model:        "kimi-k2.5",
			},
			wantDeltas: 8,
		},
		{
			fixture: "vllm_reasoning.sse",
			want: Result{
				Content:          "42",
				ReasoningContent: "hmm ok",
				FinishReason:     "length",
				Usage:            Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14, CachedTokens: 8, ReasoningTokens: 2},
				Model:            "Qwen/Qwen3-8B",
			},
			wantDeltas: 3,
		}, {
			// system_fingerprint is kept from the chunks that carry it
			// (a null in a later chunk does not erase it).
			fixture: "system_fingerprint.sse",
			want: Result{
				Content: "Hi", FinishReason: "stop", Model: "gpt-like", SystemFingerprint: "fp_44709d6fcb",
				Usage: Usage{PromptTokens: 5, CompletionTokens: 1, TotalTokens: 6},
			},
			wantDeltas: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			text := readFixture(t, tt.fixture)
			_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) { writeEvents(w, text) }, Config{})
			deltas := 0
			got, err := c.Chat(bg(t), testRequest(), func(n int) { deltas += n })
			if err != nil {
				t.Fatalf("Chat: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Result{}, "TTFT", "Duration")); diff != "" {
				t.Errorf("result mismatch (-want +got):\n%s", diff)
			}
			if deltas != tt.wantDeltas {
				t.Errorf("onDelta total = %d, want %d", deltas, tt.wantDeltas)
			}
			if got.TTFT <= 0 || got.Duration < got.TTFT {
				t.Errorf("TTFT %v, Duration %v: want 0 < TTFT <= Duration", got.TTFT, got.Duration)
			}
		})
	}
}

// TestChatReusesConnection checks that reading to [DONE] leaves the
// connection reusable, so a busy lane does not churn sockets.
func TestChatReusesConnection(t *testing.T) {
	text := readFixture(t, "sglang_plain.sse")
	var mu sync.Mutex
	remotes := map[string]bool{}
	_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes[r.RemoteAddr] = true
		mu.Unlock()
		writeEvents(w, text)
	}, Config{})
	for i := 0; i < 3; i++ {
		if _, err := c.Chat(bg(t), testRequest(), nil); err != nil {
			t.Fatalf("Chat %d: %v", i, err)
		}
	}
	if len(remotes) != 1 {
		t.Errorf("requests came from %d connections, want 1: %v", len(remotes), remotes)
	}
}

func TestChatStreamEnds(t *testing.T) {
	plain := sseLines(t, "sglang_plain.sse") // 0 role, 1-5 content, 6 finish, 7 usage, 8 [DONE]
	events := func(lines ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { writeEvents(w, strings.Join(lines, "")) }
	}
	tests := []struct {
		name        string
		handler     http.HandlerFunc
		wantClass   Class  // 0: success
		wantContent string // on success
		wantMsg     string // substring of the error
	}{
		{
			name:        "no [DONE] after finish_reason is accepted",
			handler:     events(plain[:8]...),
			wantContent: "Hello, world! <b>&</b> é中 \"quoted\"\\n",
		},
		{
			name:      "clean end without finish_reason is a cut",
			handler:   events(plain[:4]...),
			wantClass: ServerDown,
			wantMsg:   "stream cut",
		},
		{
			name:      "connection closed mid-stream",
			handler:   hijacked(chunkedHead + chunked(plain[0]) + chunked(plain[1])),
			wantClass: ServerDown,
		},
		{
			name:      "connection closed mid-chunk",
			handler:   hijacked(chunkedHead + chunked(plain[0]) + "40\r\ndata: {\"choices\""),
			wantClass: ServerDown,
		},
		{
			name:      "close-delimited body cut inside a line",
			handler:   hijacked("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + plain[1] + `data: {"choi`),
			wantClass: ServerDown,
			wantMsg:   "stream cut",
		},
		{
			name:        "connection closed after finish_reason",
			handler:     hijacked(chunkedHead + chunked(strings.Join(plain[:7], ""))),
			wantContent: "Hello, world! <b>&</b> é中 \"quoted\"\\n",
		},
		{
			name:      "malformed chunk",
			handler:   events(plain[0], "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}\n\n", plain[8]),
			wantClass: Malformed,
			wantMsg:   "bad chunk",
		},
		{
			name:      "two JSON values in one data line",
			handler:   events(plain[0], "data: {\"choices\":[]} {\"choices\":[]}\n\n", plain[6], plain[8]),
			wantClass: Malformed,
			wantMsg:   "bad chunk",
		},
		{
			name:      "truncated JSON in a complete line",
			handler:   events(plain[0], "data: {\"choices\":[{\"delta\":\n\n", plain[6], plain[8]),
			wantClass: Malformed,
			wantMsg:   "bad chunk",
		},
		{
			name:      "[DONE] without finish_reason",
			handler:   events(plain[0], plain[1], plain[8]),
			wantClass: Malformed,
			wantMsg:   "without a finish_reason",
		},
		{
			name:      "finish_reason abort",
			handler:   events(plain[1], strings.Replace(plain[6], `"stop"`, `"abort"`, 1), plain[8]),
			wantClass: Retryable,
			wantMsg:   "aborted",
		},
		{
			name: "mid-stream error event, 400 class",
			handler: events(plain[1], `data: {"error":{"object":"error","message":"invalid grammar","type":"BadRequestError","param":null,"code":400}}`+"\n\n",
				plain[8]),
			wantClass: BadRequest,
			wantMsg:   "invalid grammar",
		},
		{
			name:      "mid-stream error event, 500",
			handler:   events(plain[1], `data: {"error":{"message":"CUDA error: an illegal memory access","code":500}}`+"\n\n", plain[8]),
			wantClass: Retryable,
			wantMsg:   "illegal memory access",
		},
		{
			name: "mid-stream error event, vLLM engine dead",
			handler: events(plain[1], `data: {"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}`+"\n\n",
				plain[8]),
			wantClass: ServerDown,
			wantMsg:   "EngineCore encountered",
		},
		{
			name:      "mid-stream error event, vLLM EngineDeadError",
			handler:   events(plain[1], `data: {"error":{"message":"EngineDeadError","code":500}}`+"\n\n"),
			wantClass: ServerDown,
			wantMsg:   "EngineDeadError",
		},
		{
			name:      "mid-stream error event, SGLang scheduler exception without code",
			handler:   events(plain[1], `data: {"error":{"message":"Scheduler hit an exception: RuntimeError"}}`+"\n\n"),
			wantClass: ServerDown,
			wantMsg:   "Scheduler hit an exception",
		},
		{
			name:      "mid-stream error event, 429",
			handler:   events(`data: {"error":{"message":"too many requests","code":429}}` + "\n\n"),
			wantClass: Backpressure,
		},
		{
			name:      "mid-stream error event, 500 whose message says exceeds",
			handler:   events(plain[1], `data: {"error":{"message":"KV cache usage exceeds the pool, retry later","code":500}}`+"\n\n", plain[8]),
			wantClass: Retryable,
			wantMsg:   "KV cache usage exceeds the pool",
		},
		{
			// Words alone never dead-letter: without a code or a type the
			// error is worth another attempt.
			name:      "mid-stream error event without code, context length",
			handler:   events(`data: {"error":{"message":"The input (40000 tokens) is longer than the model's context length (32768 tokens)."}}` + "\n\n"),
			wantClass: Retryable,
			wantMsg:   "context length",
		},
		{
			name:      "mid-stream error event without code, llama-server's context type",
			handler:   events(`data: {"error":{"message":"request (4476 tokens) exceeds the available context size (4096 tokens)","type":"exceed_context_size_error"}}` + "\n\n"),
			wantClass: BadRequest,
			wantMsg:   "available context size",
		},
		{
			name: "200 with a JSON error body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"error":{"message":"model not loaded","code":503}}`)
			},
			wantClass: Retryable,
			wantMsg:   "model not loaded",
		},
		{
			name: "200 with a JSON completion instead of a stream",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
			},
			wantClass: Malformed,
			wantMsg:   "instead of an event stream",
		},
		{
			name:        "long line over the buffer size",
			handler:     events(`data: {"choices":[{"index":0,"delta":{"content":"`+strings.Repeat("x", 100<<10)+`"},"finish_reason":"stop"}]}`+"\n\n", plain[8]),
			wantContent: strings.Repeat("x", 100<<10),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newServer(t, tt.handler, Config{})
			got, err := c.Chat(bg(t), testRequest(), nil)
			if tt.wantClass == 0 {
				if err != nil {
					t.Fatalf("Chat: %v, want success", err)
				}
				if got.Content != tt.wantContent {
					t.Errorf("content = %q, want %q", got.Content, tt.wantContent)
				}
				return
			}
			if err == nil {
				t.Fatalf("Chat succeeded with %+v, want a %v error", got, tt.wantClass)
			}
			if gotClass := errClass(err); gotClass != tt.wantClass {
				t.Errorf("class = %v, want %v (err: %v)", gotClass, tt.wantClass, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestChatStatus(t *testing.T) {
	big := strings.Repeat("y", 10<<10)
	tests := []struct {
		status    int
		body      string
		wantClass Class
		wantMsg   string // exact Error.Msg
	}{
		{400, `{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 40000 tokens.","type":"BadRequestError","param":null,"code":400}`,
			BadRequest, "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens."},
		{404, `{"object":"error","message":"The model 'x' does not exist.","type":"NotFoundError","param":"model","code":"model_not_found"}`,
			ServerDown, "model_not_found: The model 'x' does not exist."},
		{413, `request entity too large`, BadRequest, "request entity too large"},
		{422, `{"detail":[{"loc":["body","messages"],"msg":"Field required","type":"missing"}]}`,
			BadRequest, `[{"loc":["body","messages"],"msg":"Field required","type":"missing"}]`},
		{409, `{"error":{"message":"prompt exceeds the slot size","code":409}}`, BadRequest, "prompt exceeds the slot size"},
		{409, `{"error":{"message":"conflict","code":409}}`, Retryable, "conflict"},
		{429, `{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}`, Backpressure, "Rate limit reached"},
		{401, `{"error":"invalid api key"}`, ServerDown, "invalid api key"},
		{500, `{"object":"error","message":"EngineCore encountered an issue. See stack trace for the root cause.","type":"InternalServerError","code":500}`,
			ServerDown, "EngineCore encountered an issue. See stack trace for the root cause."},
		{500, `{"error":{"message":"EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}`,
			ServerDown, "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."},
		{500, `{"object":"error","message":"Scheduler hit an exception: RuntimeError: CUDA error","code":500}`,
			ServerDown, "Scheduler hit an exception: RuntimeError: CUDA error"},
		{500, "Internal Server Error", Retryable, "Internal Server Error"},
		{502, "<html>Bad Gateway</html>", ServerDown, "<html>Bad Gateway</html>"},
		{503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, ServerDown, "Loading model"},
		{504, "", ServerDown, ""},
		{500, big, Retryable, big[:errBodyLimit]},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}, Config{})
			_, err := c.Chat(bg(t), testRequest(), nil)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Chat error = %v, want *Error", err)
			}
			want := &Error{Class: tt.wantClass, Status: tt.status, Msg: tt.wantMsg}
			if diff := cmp.Diff(want, e); diff != "" {
				t.Errorf("error mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClassifyStatus(t *testing.T) {
	tests := []struct {
		status     int
		retryAfter bool
		e          apiError
		want       Class
	}{
		{400, false, apiError{}, BadRequest},
		{404, false, apiError{Msg: "model not found"}, ServerDown},
		{413, false, apiError{}, BadRequest},
		{422, false, apiError{}, BadRequest},
		// A 4xx the status alone does not settle: the type, then the words.
		{418, false, apiError{Msg: "input is too long"}, BadRequest},
		{409, false, apiError{Msg: "context length exceeded"}, BadRequest},
		{409, false, apiError{Msg: "slot busy", Type: "invalid_request_error"}, BadRequest},
		{409, false, apiError{Msg: "no", CodeText: "context_length_exceeded"}, BadRequest},
		{409, false, apiError{}, Retryable},
		{408, false, apiError{}, Retryable},
		// 429 is backpressure with or without Retry-After, whatever it says.
		{429, false, apiError{}, Backpressure},
		{429, true, apiError{Msg: "maximum context length"}, Backpressure},
		{429, false, apiError{Msg: "engine is dead"}, Backpressure},
		// 503 is backpressure only when the server says when to come back.
		{503, true, apiError{Msg: "Loading model", Type: "unavailable_error"}, Backpressure},
		{503, false, apiError{Msg: "Loading model", Type: "unavailable_error"}, ServerDown},
		{502, true, apiError{}, ServerDown},
		{401, false, apiError{}, ServerDown},
		{403, true, apiError{}, ServerDown},
		{500, false, apiError{}, Retryable},
		{500, false, apiError{Msg: "engine is dead"}, ServerDown},
		{500, false, apiError{Msg: "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."}, ServerDown},
		{500, false, apiError{Msg: "Engine loop is not running. Inspect the stacktrace to find the original error"}, ServerDown},
		{500, false, apiError{Msg: "Background loop has errored already."}, ServerDown},
		{500, false, apiError{Msg: "[TP0] Scheduler hit an exception: Traceback (most recent call last):"}, ServerDown},
		{500, false, apiError{Msg: "Received sigquit from a child process. It usually means the child failed."}, ServerDown},
		{502, false, apiError{Msg: "EngineDeadError"}, ServerDown},
		{507, false, apiError{Msg: "EngineDeadError"}, ServerDown},
		{500, false, apiError{Msg: "CUDA error: an illegal memory access"}, Retryable},
		// Words and types never make a server error the request's fault.
		{500, false, apiError{Msg: "maximum context length"}, Retryable},
		{500, false, apiError{Msg: "KV cache usage exceeds the pool, retry later", Code: 500}, Retryable},
		{500, false, apiError{Msg: "prompt too long", Type: "invalid_request_error"}, Retryable},
		{400, false, apiError{Msg: "EngineDeadError"}, BadRequest},
		{501, false, apiError{}, Retryable},
		{502, false, apiError{}, ServerDown},
		{503, false, apiError{}, ServerDown},
		{504, false, apiError{}, ServerDown},
	}
	for _, tt := range tests {
		if got := classifyStatus(tt.status, tt.retryAfter, tt.e); got != tt.want {
			t.Errorf("classifyStatus(%d, %v, %+v) = %v, want %v", tt.status, tt.retryAfter, tt.e, got, tt.want)
		}
	}
}

func TestClassifyEvent(t *testing.T) {
	tests := []struct {
		e    apiError
		want Class
	}{
		{apiError{Code: 400, Msg: "bad"}, BadRequest},
		{apiError{Code: 422}, BadRequest},
		{apiError{Code: 429}, Backpressure},
		{apiError{Code: 429, Msg: "engine is dead"}, Backpressure},
		{apiError{Code: 408}, Retryable},
		{apiError{Code: 500}, Retryable},
		{apiError{Code: 503}, Retryable},
		{apiError{}, Retryable},
		// Issue 22: "exceeds" in a server error's message made it a bad
		// request and dead-lettered 15 samples in 0.3 s.
		{apiError{Code: 500, Msg: "KV cache usage exceeds the pool, retry later"}, Retryable},
		{apiError{Code: 500, Msg: "maximum context length"}, Retryable},
		{apiError{Code: 500, Msg: "too long", Type: "server_error"}, Retryable},
		// Without a code, the structured type decides, never the words.
		{apiError{Msg: "prompt is too long"}, Retryable},
		{apiError{Msg: "KV cache usage exceeds the pool"}, Retryable},
		{apiError{Msg: "request (4476 tokens) exceeds the available context size (4096 tokens)", Type: "exceed_context_size_error"}, BadRequest},
		{apiError{Msg: "x", Type: "BadRequestError"}, BadRequest},
		{apiError{Msg: "x", Type: "invalid_request_error", CodeText: "context_length_exceeded"}, BadRequest},
		{apiError{Msg: "Rate limit reached", Type: "requests", CodeText: "rate_limit_exceeded"}, Backpressure},
		{apiError{Msg: "x", Type: "server_error"}, Retryable},
		{apiError{Msg: "x", Type: "something_new"}, Retryable},
		{apiError{Code: 500, Msg: "EngineCore encountered an issue. See stack trace (above) for the root cause."}, ServerDown},
		{apiError{Code: 500, Msg: "vllm.v1.engine.exceptions.EngineDeadError"}, ServerDown},
		{apiError{Msg: "Engine loop is not running"}, ServerDown},
		{apiError{Msg: "Engine loop is not running", Type: "invalid_request_error"}, ServerDown},
		{apiError{Code: 503, Msg: "engine is dead"}, ServerDown},
		{apiError{Code: 500, Msg: "Scheduler hit an exception"}, ServerDown},
		{apiError{Code: 500, Msg: "SIGQUIT received. signum=None, frame=None. It usually means one child failed."}, ServerDown},
		{apiError{Code: 500, Msg: "CUDA error: an illegal memory access"}, Retryable},
		{apiError{Code: 400, Msg: "EngineDeadError"}, BadRequest},
	}
	for _, tt := range tests {
		if got := classifyEvent(tt.e); got != tt.want {
			t.Errorf("classifyEvent(%+v) = %v, want %v", tt.e, got, tt.want)
		}
	}
}

func TestParseErrorBody(t *testing.T) {
	tests := []struct {
		body string
		want apiError
	}{
		{`{"error":{"message":"m","code":400}}`, apiError{Msg: "m", Code: 400}},
		{`{"error":{"message":"m","code":"400"}}`, apiError{Msg: "m", Code: 400}},
		{`{"error":{"message":"too big","code":"context_length_exceeded"}}`, apiError{Msg: "context_length_exceeded: too big", CodeText: "context_length_exceeded"}},
		{`{"error":{"type":"server_error"}}`, apiError{Msg: "server_error", Type: "server_error"}},
		{`{"error":{"code":400,"message":"request (4476 tokens) exceeds the available context size (4096 tokens)","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}}`,
			apiError{Msg: "request (4476 tokens) exceeds the available context size (4096 tokens)", Code: 400, Type: "exceed_context_size_error"}},
		{`{"error":{"message":"KV cache usage exceeds the pool, retry later","code":500}}`, apiError{Msg: "KV cache usage exceeds the pool, retry later", Code: 500}},
		{`{"error":"plain"}`, apiError{Msg: "plain"}},
		{`{"object":"error","message":"m2","type":"BadRequestError","code":422}`, apiError{Msg: "m2", Code: 422, Type: "BadRequestError"}},
		{`{"detail":"Not Found"}`, apiError{Msg: "Not Found"}},
		{"  not json \n", apiError{Msg: "not json"}},
		{`{"other":1}`, apiError{Msg: `{"other":1}`}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, parseErrorBody([]byte(tt.body))); diff != "" {
			t.Errorf("parseErrorBody(%s) mismatch (-want +got):\n%s", tt.body, diff)
		}
	}
}

func TestChatTransportErrors(t *testing.T) {
	plain := sseLines(t, "sglang_plain.sse")
	tests := []struct {
		name    string
		cfg     Config
		handler http.HandlerFunc
		wantMsg string
	}{
		{
			name:    "closed before headers",
			handler: hijacked(""),
		},
		{
			name:    "no headers within the idle timeout",
			cfg:     Config{IdleTimeout: 200 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) { blockUntilGone(r) },
			wantMsg: "no response headers",
		},
		{
			name: "no first byte within FirstByteTimeout",
			cfg:  Config{IdleTimeout: time.Minute, FirstByteTimeout: 200 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				blockUntilGone(r)
			},
			wantMsg: "no first byte",
		},
		{
			name: "stream goes idle",
			cfg:  Config{IdleTimeout: 200 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, plain[0]+plain[1])
				blockUntilGone(r)
			},
			wantMsg: "stream idle",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newServer(t, tt.handler, tt.cfg)
			_, err := c.Chat(bg(t), testRequest(), nil)
			if got := errClass(err); got != ServerDown {
				t.Fatalf("class = %v, want %v (err: %v)", got, ServerDown, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

// TestChatRequestTimeout checks who RequestTimeout blames: the sample when
// tokens were still flowing (a generation longer than the timeout, which
// must spend attempts and end dead-lettered), the server otherwise.
func TestChatRequestTimeout(t *testing.T) {
	plain := sseLines(t, "sglang_plain.sse") // 0 role, 1-5 content
	// every writes line every 10ms until the client goes away.
	every := func(w http.ResponseWriter, r *http.Request, line string) {
		for {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
				io.WriteString(w, line)
				w.(http.Flusher).Flush()
			}
		}
	}
	tests := []struct {
		name      string
		cfg       Config
		handler   http.HandlerFunc
		wantClass Class
		wantMsg   []string
	}{
		{
			name: "tokens keep coming",
			cfg:  Config{RequestTimeout: 300 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, plain[0])
				every(w, r, plain[1])
			},
			wantClass: Retryable,
			wantMsg:   []string{"request timeout 300ms exceeded while streaming (", " chunks received)", "raise generation.request_timeout"},
		},
		{
			name:      "no response headers",
			cfg:       Config{RequestTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute},
			handler:   func(w http.ResponseWriter, r *http.Request) { blockUntilGone(r) },
			wantClass: ServerDown,
			wantMsg:   []string{"request timeout 300ms"},
		},
		{
			name: "headers but no first byte",
			cfg:  Config{RequestTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute},
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				blockUntilGone(r)
			},
			wantClass: ServerDown,
			wantMsg:   []string{"request timeout 300ms"},
		},
		{
			name: "role chunk and keep-alives but no token",
			cfg:  Config{RequestTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute},
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, plain[0])
				every(w, r, ": keep-alive\n\n")
			},
			wantClass: ServerDown,
			wantMsg:   []string{"request timeout 300ms"},
		},
		{
			// Keep-alives do not hide the silence: no token for the idle
			// timeout cuts the stream (issue 29 item 4), before the request timeout.
			name: "tokens stopped, keep-alives do not hide the silence",
			cfg:  Config{RequestTimeout: 400 * time.Millisecond, IdleTimeout: 100 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, plain[0]+plain[1])
				every(w, r, ": keep-alive\n\n")
			},
			wantClass: ServerDown,
			wantMsg:   []string{"no token for 1", "bytes that carried none", "stream without progress"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newServer(t, tt.handler, tt.cfg)
			_, err := c.Chat(bg(t), testRequest(), nil)
			if got := errClass(err); got != tt.wantClass {
				t.Fatalf("class = %v, want %v (err: %v)", got, tt.wantClass, err)
			}
			for _, m := range tt.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

func TestChatConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := New(Config{BaseURL: "http://" + addr})
	defer c.Close()
	_, err = c.Chat(bg(t), testRequest(), nil)
	if got := errClass(err); got != ServerDown {
		t.Errorf("class = %v, want %v (err: %v)", got, ServerDown, err)
	}
	if _, err := c.Models(bg(t)); errClass(err) != ServerDown {
		t.Errorf("Models class = %v, want %v (err: %v)", errClass(err), ServerDown, err)
	}
}

func TestChatBadBaseURL(t *testing.T) {
	for _, base := range []string{"", "127.0.0.1:30000", "ftp://host", "http://"} {
		c := New(Config{BaseURL: base})
		_, err := c.Chat(bg(t), testRequest(), nil)
		if got := errClass(err); got != ServerDown {
			t.Errorf("base %q: class = %v, want %v (err: %v)", base, got, ServerDown, err)
		}
		c.Close()
	}
}

func TestChatRequest(t *testing.T) {
	type seen struct {
		method, path, auth, ctype, accept string
		body                              string
	}
	text := readFixture(t, "sglang_plain.sse")
	var got seen
	handler := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = seen{r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Header.Get("Accept"), string(b)}
		writeEvents(w, text)
	}
	req := Request{
		Model: "kimi-k2.5",
		Body: []byte(`{"messages":[{"role":"user","content":"hi <b>&</b>"}],` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],` +
			`"temperature":0.1,"stream":false,"model":"from-body"}`),
		MaxTokens: 512,
		Params: map[string]json.RawMessage{
			"temperature":          []byte(`0.7`),
			"chat_template_kwargs": []byte(`{"thinking": true}`),
			"top_k":                []byte(`20`),
			"max_tokens":           []byte(`5`),
			"stream_options":       []byte(`{"include_usage":false}`),
		},
	}
	wantBody := `{"chat_template_kwargs":{"thinking":true},"max_tokens":512,` +
		`"messages":[{"role":"user","content":"hi <b>&</b>"}],"model":"kimi-k2.5","stream":true,` +
		`"stream_options":{"include_usage":true},"temperature":0.7,` +
		`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"top_k":20}`
	for _, suffix := range []string{"", "/", "/v1", "/v1/"} {
		t.Run("base"+suffix, func(t *testing.T) {
			srv := newHTTPServer(t, handler)
			c := New(Config{BaseURL: srv + suffix, APIKey: "sk-test"})
			defer c.Close()
			if _, err := c.Chat(bg(t), req, nil); err != nil {
				t.Fatalf("Chat: %v", err)
			}
			want := seen{"POST", "/v1/chat/completions", "Bearer sk-test", "application/json", "text/event-stream", wantBody}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(seen{})); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("no key, no max_tokens", func(t *testing.T) {
		srv := newHTTPServer(t, handler)
		c := New(Config{BaseURL: srv})
		defer c.Close()
		r := Request{Body: []byte(`{"messages":[],"max_tokens":9}`)}
		if _, err := c.Chat(bg(t), r, nil); err != nil {
			t.Fatalf("Chat: %v", err)
		}
		if got.auth != "" {
			t.Errorf("Authorization = %q, want none", got.auth)
		}
		want := `{"max_tokens":9,"messages":[],"stream":true,"stream_options":{"include_usage":true}}`
		if got.body != want {
			t.Errorf("body = %s, want %s", got.body, want)
		}
	})
}

// newHTTPServer starts a server and returns its URL.
func newHTTPServer(t *testing.T, h http.HandlerFunc) string {
	srv, c := newServer(t, h, Config{})
	c.Close()
	return srv.URL
}

func TestChatInvalidRequest(t *testing.T) {
	calls := 0
	srv := newHTTPServer(t, func(w http.ResponseWriter, r *http.Request) { calls++ })
	c := New(Config{BaseURL: srv})
	defer c.Close()
	tests := []struct {
		name string
		req  Request
	}{
		{"body is an array", Request{Body: []byte(`[1]`)}},
		{"body is broken", Request{Body: []byte(`{"messages":`)}},
		{"param is broken", Request{Body: []byte(`{}`), Params: map[string]json.RawMessage{"top_k": []byte(`2 0`)}}},
	}
	for _, tt := range tests {
		_, err := c.Chat(bg(t), tt.req, nil)
		if got := errClass(err); got != BadRequest {
			t.Errorf("%s: class = %v, want %v (err: %v)", tt.name, got, BadRequest, err)
		}
	}
	if calls != 0 {
		t.Errorf("server saw %d requests, want 0", calls)
	}
}

func TestChatCallerCancel(t *testing.T) {
	plain := sseLines(t, "sglang_plain.sse")
	t.Run("mid-stream", func(t *testing.T) {
		_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, plain[0]+plain[1])
			blockUntilGone(r)
		}, Config{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, err := c.Chat(ctx, testRequest(), func(int) { cancel() })
		checkCanceled(t, err)
	})
	t.Run("before headers", func(t *testing.T) {
		arrived := make(chan struct{})
		_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			close(arrived)
			blockUntilGone(r)
		}, Config{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			<-arrived
			cancel()
		}()
		_, err := c.Chat(ctx, testRequest(), nil)
		checkCanceled(t, err)
	})
}

func checkCanceled(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	var e *Error
	if errors.As(err, &e) {
		t.Errorf("err is a classified *Error (%v); the caller's cancel must pass through", e.Class)
	}
}

func TestModels(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		body      string
		want      []string
		wantClass Class
	}{
		{"sglang", 200, `{"object":"list","data":[{"id":"kimi-k2.5","object":"model","created":1,"owned_by":"sglang","root":"kimi-k2.5","parent":null,"max_model_len":262144}]}`,
			[]string{"kimi-k2.5"}, 0},
		{"two", 200, `{"data":[{"id":"a"},{"id":"b"}]}`, []string{"a", "b"}, 0},
		{"empty", 200, `{"data":[]}`, []string{}, 0},
		{"broken", 200, `{"data":[`, nil, Malformed},
		{"loading", 503, `{"error":{"code":503,"message":"Loading model"}}`, nil, ServerDown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var path, auth string
			_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				path, auth = r.URL.Path, r.Header.Get("Authorization")
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}, Config{APIKey: "k"})
			got, err := c.Models(bg(t))
			if path != "/v1/models" || auth != "Bearer k" {
				t.Errorf("server saw path %q auth %q, want /v1/models and Bearer k", path, auth)
			}
			if tt.wantClass != 0 {
				if errClass(err) != tt.wantClass {
					t.Errorf("class = %v, want %v (err: %v)", errClass(err), tt.wantClass, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Models: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("models mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChatConcurrent(t *testing.T) {
	text := readFixture(t, "sglang_reasoning_tools.sse")
	_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) { writeEvents(w, text) }, Config{MaxConns: 8})
	want, err := c.Chat(bg(t), testRequest(), nil)
	if err != nil {
		t.Fatalf("Chat: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*5)
	for range 8 {
		wg.Go(func() {
			for range 5 {
				got, err := c.Chat(bg(t), testRequest(), nil)
				if err != nil {
					errs <- err
					return
				}
				if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Result{}, "TTFT", "Duration")); diff != "" {
					errs <- errors.New("result mismatch (-want +got):\n" + diff)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
