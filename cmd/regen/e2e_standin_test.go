package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// ownJob is a job of partition P (prompts.jsonl) and the sources more
// lists, sent to url with one lane of the given concurrency.
func ownJob(url string, lane int, more ...string) string {
	return fmt.Sprintf(`name: own
model: m
endpoints: [{url: "%s", engine: sglang}]
sources:
  - {partition: P, path: prompts.jsonl, prompt: question, id: id}
%slanes:
  - {name: short, concurrency: %d, max_tokens: 64}
monitor: {heartbeat_every: 200ms, dead_after: 2s}
output: {formats: [sharegpt]}
`, url, strings.Join(more, ""), lane)
}

// answerServer is a stand-in OpenAI-compatible server that streams one
// short answer per request, can hold requests until released, and records
// the most requests it had in flight at once.
type answerServer struct {
	url      string
	answer   string // "" answers with an empty message
	tooLong  int    // a request body over this many bytes is refused with 400 (0: none)
	mu       sync.Mutex
	held     chan struct{} // closed: answer at once
	free     int           // requests still answered at once while held
	inFlight atomic.Int64
	peak     atomic.Int64
	noHealth atomic.Bool // /health answers 404, as on servers without one
}

func startAnswerServer(t *testing.T, answer string) *answerServer {
	t.Helper()
	a := &answerServer{held: make(chan struct{}), answer: answer}
	close(a.held)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			if a.noHealth.Load() {
				http.NotFound(w, r)
			}
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/v1/chat/completions":
			if body, _ := io.ReadAll(r.Body); a.tooLong > 0 && len(body) > a.tooLong {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"error":{"message":"the prompt is too long: %d bytes","type":"BadRequestError","code":400}}`, len(body))
				return
			}
			n := a.inFlight.Add(1)
			defer a.inFlight.Add(-1)
			for p := a.peak.Load(); n > p && !a.peak.CompareAndSwap(p, n); p = a.peak.Load() {
			}
			a.mu.Lock()
			held := a.held
			if a.free > 0 {
				a.free--
				held = nil
			}
			a.mu.Unlock()
			if held != nil {
				select {
				case <-held:
				case <-r.Context().Done():
					return
				}
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":%q},\"finish_reason\":null}]}\n\n", a.answer)
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5,\"total_tokens\":14}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// hold makes requests wait until release.
func (a *answerServer) hold() { a.holdAfter(0) }

// holdAfter answers the next n requests at once and holds the rest.
func (a *answerServer) holdAfter(n int) {
	a.mu.Lock()
	a.held = make(chan struct{})
	a.free = n
	a.mu.Unlock()
}

func (a *answerServer) release() {
	a.mu.Lock()
	close(a.held)
	a.free = 0
	a.mu.Unlock()
}

func writePrompts(t *testing.T, path string, n int) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id": "q%03d", "question": "q%03d: what is %d plus %d?"}`+"\n", i, i, i, i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
