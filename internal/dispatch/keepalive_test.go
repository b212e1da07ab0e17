package dispatch

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/llm/llmtest"
	"github.com/regen-dev/regen/internal/store"
)

// TestKeepAliveClosesAreNotOutages is issue 22's tenth fault through the
// dispatcher: a server that closes the connection after every streamed
// answer while its headers say Keep-Alive (as llama-server does), racing
// the next request. 1,000 samples at concurrency 8 through the real llm
// client: no breaker opens, no error, every sample done once with one
// attempt.
func TestKeepAliveClosesAreNotOutages(t *testing.T) {
	const n = 1000
	srv := llmtest.NewClosingServer(t, 3)
	c := llm.New(llm.Config{BaseURL: srv.URL, MaxConns: 8, IdleTimeout: 10 * time.Second})
	t.Cleanup(c.Close)
	st := newFakeStore()
	st.add("short", "s", n)
	var logs bytes.Buffer // slog's handler serialises its writes
	cfg := baseConfig(st, []Endpoint{{URL: srv.URL, Client: c}})
	cfg.Lanes[0].Concurrency = 8
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	d := mustNew(t, cfg)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	opens := strings.Count(logs.String(), "breaker open")
	if opens != 0 {
		t.Errorf("%d breaker opens, want 0; log:\n%s", opens, logs.String())
	}
	if errs := d.Snapshot().Endpoints[0].Errors; len(errs) != 0 {
		t.Errorf("endpoint errors %v, want none", errs)
	}
	if diff := cmp.Diff(map[store.State]int{store.Done: n}, st.states()); diff != "" {
		t.Errorf("final states (-want +got):\n%s", diff)
	}
	st.mu.Lock()
	for i := range n {
		id := sampleID("s", i)
		if s := st.samples[id]; s.attempts != 1 || st.finals[id] != 1 {
			t.Errorf("%s: %d attempts, %d final transitions; want 1 and 1", id, s.attempts, st.finals[id])
		}
	}
	st.mu.Unlock()
	if srv.Dropped.Load() == 0 {
		t.Errorf("the server dropped no request on a closing connection: the race was not run")
	}
	t.Logf("%d samples, %d breaker opens; the server dropped %d requests on closing connections, the client replayed %d",
		n, opens, srv.Dropped.Load(), c.Replays())
}
