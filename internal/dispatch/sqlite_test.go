package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestSQLiteStopAndResume runs a job against a real SQLite file in real
// time: failures of every class, an interrupted first run, and a second
// runner that finishes the job. Every sample must end exactly once.
func TestSQLiteStopAndResume(t *testing.T) {
	const n = 300
	path := filepath.Join(t.TempDir(), "job.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// Closed at the end, not deferred: after a deadlock Close would block too.
	var ns []store.NewSample
	for i := range n {
		id := fmt.Sprintf("s-%05d", i)
		ns = append(ns, store.NewSample{ID: id, Partition: "p", Lane: "short", Body: []byte(`{"messages":[{"role":"user","content":"` + id + `"}]}`)})
	}
	if _, err := st.Ingest(t.Context(), ns); err != nil {
		t.Fatal(err)
	}

	tr := newTracker()
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(42, 43))
	eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
		mu.Lock()
		p, d := rnd.Float64(), time.Duration(rnd.IntN(4000))*time.Microsecond
		mu.Unlock()
		switch {
		case p < 0.05:
			return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "connection refused"}
		case p < 0.12:
			return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 429}
		case p < 0.13:
			return llm.Result{}, &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "context too long"}
		case p < 0.20 && c.req.MaxTokens == 100:
			return generate(ctx, c, d, "length")
		}
		return generate(ctx, c, d, "stop")
	}, "http://a", "http://b")
	cfg := baseConfig(st, eps)
	cfg.Lanes = []LaneConfig{
		{Name: "short", Concurrency: 8, MaxTokens: 100, EscalateTo: "long"},
		{Name: "long", Concurrency: 4, MaxTokens: 1000},
	}
	cfg.MaxAttempts = 4
	cfg.BaseDelay, cfg.MaxDelay = 5*time.Millisecond, 20*time.Millisecond
	cfg.BreakerCooldown = 5 * time.Millisecond
	cfg.DrainTimeout = time.Second

	// First runner: stopped after about a third of the job.
	first := cfg
	first.Owner = "runner-1"
	d1 := mustNew(t, first)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for d1.Snapshot().Counters.Done < n/3 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	err1 := runGuarded(t, ctx, d1)
	cancel() // in case Run ended on its own
	<-stopped
	if !errors.Is(err1, context.Canceled) {
		t.Fatalf("first Run = %v, want context.Canceled", err1)
	}
	counts, err := st.Counts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		if c.State == store.Leased {
			t.Errorf("after the drain %d samples of lane %s are still leased, want none", c.N, c.Lane)
		}
	}

	second := cfg
	second.Owner = "runner-2"
	d2 := mustNew(t, second)
	if err := runGuarded(t, t.Context(), d2); err != nil {
		t.Fatalf("second Run: %v", err)
	}

	seen := map[string]int{}
	states := map[store.State]int{}
	if err := st.Finished(t.Context(), func(r store.Row) error {
		seen[r.ID]++
		states[r.State]++
		if r.State == store.Done && r.Result.Endpoint == "" {
			t.Errorf("%s: done without an endpoint", r.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Errorf("finished %d distinct samples, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s finished %d times", id, k)
		}
	}
	c1, c2 := d1.Snapshot().Counters, d2.Snapshot().Counters
	if got := int(c1.Done + c2.Done + c1.DeadLettered + c2.DeadLettered); got != n {
		t.Errorf("done+dead over both runners = %d, want %d (states %v)", got, n, states)
	}
	if int(c1.Done+c2.Done) != states[store.Done] {
		t.Errorf("done counters %d+%d, store has %d done", c1.Done, c2.Done, states[store.Done])
	}
	if err := st.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// runGuarded runs d and panics with every goroutine's stack if Run has not
// returned after a minute (the job takes about a second), so a deadlock in
// the store or the dispatcher is reported at once and with its cause instead
// of at the test binary's ten-minute timeout. A panic, not t.Fatal: the
// deferred store Close could block on the same deadlock.
func runGuarded(t *testing.T, ctx context.Context, d *Dispatcher) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- d.Run(ctx) }()
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	select {
	case err := <-errc:
		return err
	case <-guard.C:
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		panic(fmt.Sprintf("%s: Run still running after a minute: deadlock\n%s", t.Name(), buf))
	}
}
