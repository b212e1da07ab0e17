package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const misfitJob = `name: misfit
model: m
endpoints: [{url: "%s", engine: sglang}]
sources:
  - {partition: P, path: prompts.jsonl, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 8, max_tokens: 64}
generation: {header_timeout: 1s}
monitor: {heartbeat_every: 200ms, dead_after: 2s}
`

// TestE2EServerSpeaksSomethingElse: a server that answers 200 with a
// whole JSON completion, a web page, 2 MB of headers and no body, or never
// sends headers for a chat request: each is the endpoint's fault, named
// in its own words; the run stops with exit 1 within seconds, no sample
// is dead and none spent an attempt.
func TestE2EServerSpeaksSomethingElse(t *testing.T) {
	t.Parallel()
	pad := strings.Repeat("x", 8000)
	tests := []struct {
		name    string
		handler func(w http.ResponseWriter, r *http.Request)
		want    []string
	}{
		{"whole JSON completion", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
		}, []string{"answered 200 with a JSON body instead of an event stream", "is this an OpenAI-compatible endpoint?", "check its url"}},
		{"web page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html><body>It works!</body></html>")
		}, []string{"answered 200 with text/html, not an event stream: is this an OpenAI-compatible endpoint?", "It works!"}},
		{"2 MB of headers, empty body", func(w http.ResponseWriter, r *http.Request) {
			for i := range 256 {
				w.Header().Set(fmt.Sprintf("X-Pad-%d", i), pad)
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
		}, []string{"KiB of headers and an empty body, not an event stream"}},
		{"no headers", func(w http.ResponseWriter, r *http.Request) {
			// The server notices the client went away only once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}, []string{"no response headers within 1s: the server accepts connections but does not answer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, chats := chatStandin(t, "m", tt.handler)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(misfitJob, url)), 0o644); err != nil {
				t.Fatal(err)
			}
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 100)
			res := regen(t, dir, "run", "job.yaml")
			t.Logf("exit %d after %s and %d requests: %s", res.code, res.dur.Round(time.Millisecond), chats.Load(), strings.TrimSpace(res.stderr))
			if res.code == 0 {
				t.Fatalf("run against a server that is not an event stream exited 0:\n%s", res)
			}
			for _, w := range tt.want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, res.stderr)
				}
			}
			if n := chats.Load(); n == 0 || n > 30 {
				t.Errorf("%d requests before stopping, want a few (1 to 30)", n)
			}
			db := openStoreRO(t, filepath.Join(dir, "misfit.db"))
			c, err := storeCounts(context.Background(), db)
			if err != nil || c["pending"] != 100 {
				t.Errorf("store states %v (%v), want all 100 pending", c, err)
			}
			var spent int
			if err := db.QueryRow(`SELECT COALESCE(SUM(attempts), 0) FROM samples`).Scan(&spent); err != nil || spent != 0 {
				t.Errorf("attempts spent = %d (%v), want 0", spent, err)
			}
		})
	}
}
