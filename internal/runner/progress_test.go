package runner

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// keepAliveServer is a stand-in that answers every prompt with four tokens,
// except the prompt containing chatter: that one gets a role chunk and then
// a ": keepalive" comment every 100 ms for ever (issue 29 item 4).
func keepAliveServer(t *testing.T, chatter string, sent, calls *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		chunk := `data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":%q},"finish_reason":%s}]}` + "\n\n"
		if !strings.Contains(req.Messages[len(req.Messages)-1].Content, chatter) {
			for i := range 4 {
				fmt.Fprintf(w, chunk, fmt.Sprintf("tok%d ", i), "null")
			}
			fmt.Fprintf(w, chunk, "", `"stop"`)
			fmt.Fprint(w, `data: {"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}`+"\n\ndata: [DONE]\n\n")
			f.Flush()
			return
		}
		calls.Add(1)
		fmt.Fprintf(w, chunk, "", "null")
		f.Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			n, err := fmt.Fprint(w, ": keepalive\n\n")
			if err != nil {
				return
			}
			sent.Add(int64(n))
			f.Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestKeepAlivesForEverForOnePrompt: a server that streams keep-alives for
// ever for one prompt while it answers the others. The stream is cut at
// half the hang deadline without a token (before the hang rule would pause
// the whole endpoint), the cut is that sample's once it repeats while the
// server works, and the job ends: that sample dead with the evidence after
// its attempts, every other done, no STALLED endpoint.
func TestKeepAlivesForEverForOnePrompt(t *testing.T) {
	var sent, calls atomic.Int64
	srv := keepAliveServer(t, "item 3.", &sent, &calls)
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 20)
	spec := loadJobYAML(t, dir, fmt.Sprintf(`name: keepalive
model: m
endpoints: [{url: %q, engine: sglang}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 4, max_tokens: 64}]
retry: {max_attempts: 3, base_delay: 100ms, max_delay: 500ms}
monitor: {heartbeat_every: 100ms, dead_after: 5s, stall_after: 60s, hang_after: 2s}
`, srv.URL))
	st := openStore(t, spec)
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := startRun(t, spec, st, true).wait(t, 2*time.Minute)
	took := time.Since(start)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("run ended after %s: %v", took.Round(time.Millisecond), err)
	if got := countState(t, st, store.Done); got != 19 {
		t.Errorf("done: got %d, want 19", got)
	}
	var dead []store.Row
	for _, r := range finishedRows(t, st) {
		if r.State == store.Dead {
			dead = append(dead, r)
		} else if r.Attempts != 1 {
			t.Errorf("sample %s: %d attempts, want 1 (%s)", r.ID, r.Attempts, spentOn(t, st, r.ID))
		}
	}
	if len(dead) != 1 || dead[0].ID != "p/s0003" || !strings.Contains(dead[0].Reason, "carried none") || !strings.Contains(dead[0].Reason, "fault follows this sample") {
		t.Fatalf("dead letters %+v: want p/s0003's, with the keep-alives and the fault as evidence", dead)
	}
	for _, e := range endpointEvents(t, st, time.Time{}) {
		if e.State == "STALLED" {
			t.Errorf("endpoint STALLED (%s): the per-request cut should come first", e.Evidence)
		}
	}
	t.Logf("%d requests for the keep-alive prompt, %d bytes of keep-alives sent; heap %.1f -> %.1f MiB; dead letter: %s",
		calls.Load(), sent.Load(), float64(before.HeapAlloc)/(1<<20), float64(after.HeapAlloc)/(1<<20), dead[0].Reason)
}
