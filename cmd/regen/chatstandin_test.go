package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// chatStandin is a loopback stand-in for an OpenAI-compatible server:
// /health answers 200, /v1/models lists model, every chat request is
// counted and handed to chat. It is closed when t ends.
func chatStandin(t *testing.T, model string, chat http.HandlerFunc) (url string, chats *atomic.Int64) {
	t.Helper()
	chats = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q}]}`, model)
		case "/v1/chat/completions":
			chats.Add(1)
			chat(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, chats
}

// streamOneToken answers a chat request with a one-token event stream
// ("four", finish_reason stop, usage 9 + 1).
func streamOneToken(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"four\"},\"finish_reason\":null}]}\n\n")
	fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n")
	fmt.Fprint(w, "data: [DONE]\n\n")
}
