package llm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestNotAnEventStream: a server that answers 200 with something other
// than an event stream, or never sends headers, gets an EndpointFault
// error that says what came back, and the call returns within its
// header timeout.
func TestNotAnEventStream(t *testing.T) {
	pad := strings.Repeat("x", 8000)
	tests := []struct {
		name      string
		cfg       Config
		handler   http.HandlerFunc
		wantClass Class
		wantMsg   string
	}{
		{
			name: "a whole JSON completion",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
			},
			wantClass: Malformed,
			wantMsg:   `answered 200 with a JSON body instead of an event stream ("stream": true ignored): is this an OpenAI-compatible endpoint?`,
		},
		{
			name: "a web page",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				fmt.Fprint(w, "<!doctype html>\n<html><body>Welcome to nginx!</body></html>")
			},
			wantClass: Malformed,
			wantMsg:   "answered 200 with text/html, not an event stream: is this an OpenAI-compatible endpoint? (body starts: <!doctype html> <html>",
		},
		{
			name: "2 MB of headers and an empty body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				for i := range 256 {
					w.Header().Set(fmt.Sprintf("X-Pad-%d", i), pad)
				}
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
			},
			wantClass: ServerDown,
			wantMsg:   "KiB of headers and an empty body, not an event stream: is this an OpenAI-compatible endpoint?",
		},
		{
			name:      "no headers",
			cfg:       Config{HeaderTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute},
			handler:   func(w http.ResponseWriter, r *http.Request) { blockUntilGone(r) },
			wantClass: ServerDown,
			wantMsg:   "no response headers within 300ms: the server accepts connections but does not answer",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newServer(t, tt.handler, tt.cfg)
			start := time.Now()
			_, err := c.Chat(context.Background(), Request{Model: "m", Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`)}, nil)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Chat = %v, want an *Error", err)
			}
			if e.Class != tt.wantClass || !e.EndpointFault || !strings.Contains(e.Msg, tt.wantMsg) {
				t.Errorf("error = %s (class %v, endpoint fault %v); want class %v, an endpoint fault, saying %q", e, e.Class, e.EndpointFault, tt.wantClass, tt.wantMsg)
			}
			t.Logf("%s after %s", e, time.Since(start).Round(time.Millisecond))
		})
	}
}
