package runner

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// A healthy server that refuses the job's model name (vLLM answers 404 to
// every request) must not dead-letter the dataset: the job is DOWN with the
// server's words as evidence, and every sample stays pending, unspent.
func TestWrongModelNameIsDownNotDeadLetters(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(http.StatusOK)
		case "/v1/chat/completions":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"object":"error","message":"The model 'wrong-name' does not exist.","type":"NotFoundError","param":"model","code":404}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 40)
	jobYAML := fmt.Sprintf(`name: misconfig
model: wrong-name
endpoints: [{url: %q, engine: vllm}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 8, max_tokens: 64}]
monitor: {heartbeat_every: 100ms, dead_after: 5s, stall_after: 60s}
`, srv.URL)
	spec := loadJobYAML(t, dir, jobYAML)
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	var rep monitor.Report
	var err error
	waitFor(t, r, 30*time.Second, "the job to be DOWN", func() bool {
		rep, err = monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter})
		return err == nil && rep.State == monitor.Down
	})
	if ev := strings.Join(rep.Evidence, "; "); !strings.Contains(ev, "does not exist") {
		t.Errorf("DOWN evidence %q does not carry the server's message", ev)
	}
	if rep.Total.Dead != 0 || rep.Total.Done != 0 {
		t.Errorf("dead %d, done %d; want every sample still to do", rep.Total.Dead, rep.Total.Done)
	}
	for _, row := range finishedRows(t, st) {
		t.Errorf("sample %s finished as %s: %s", row.ID, row.State, row.Reason)
	}
	var spent int
	claimed, err := st.Claim(context.Background(), "default", 100, "inspector", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		spent += c.Attempts
	}
	if spent != 0 {
		t.Errorf("%d attempts spent by a misconfigured endpoint, want 0", spent)
	}
}
