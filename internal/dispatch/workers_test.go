package dispatch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// TestServeOnlySomeLanes: a worker serving only "short" finishes when its
// lane is empty and leaves "long" (including samples it escalates there)
// to the workers that serve it.
func TestServeOnlySomeLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 5)
		st.add("long", "l", 3)
		tr := newTracker()
		eps, _ := fleet(tr, ok(time.Second), "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 4, MaxTokens: 100, EscalateTo: "long"}, {Name: "long", Concurrency: 2, MaxTokens: 1000}}
		cfg.Serve = []string{"short"}
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if got := st.states(); got[store.Done] != 5 || got[store.Pending] != 3 {
			t.Errorf("states = %v, want the 5 short done and the 3 long still pending", got)
		}
		for i := range 3 {
			if n := tr.callsOf(sampleID("l", i)); n != 0 {
				t.Errorf("long sample %d sent %d times by a worker not serving long", i, n)
			}
		}
	})
	if _, err := New(Config{Store: newFakeStore(), Owner: "o", Lanes: []LaneConfig{{Name: "a", Concurrency: 1}},
		Endpoints: []Endpoint{{URL: "u", Client: &fakeChatter{}}}, Serve: []string{"b"}}); err == nil {
		t.Error("New with Serve naming an unknown lane succeeded")
	}
}

// TestRunWaitsForIngest: an empty queue is not the end while ingest is
// still adding samples; Wake picks new ones up at once.
func TestRunWaitsForIngest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		tr := newTracker()
		eps, _ := fleet(tr, ok(time.Second), "http://a")
		cfg := baseConfig(st, eps)
		ingestDone := make(chan struct{})
		cfg.IngestDone = ingestDone
		d := mustNew(t, cfg)
		wait := runAsync(t.Context(), d)
		time.Sleep(time.Minute) // long past every idle check
		st.add("short", "a", 3)
		d.Wake()
		time.Sleep(5 * time.Second)
		if got := st.states(); got[store.Done] != 3 {
			t.Fatalf("states = %v, want the first 3 done while ingest runs", got)
		}
		st.add("short", "b", 2)
		close(ingestDone)
		start := time.Now()
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if got := st.states(); got[store.Done] != 5 {
			t.Errorf("states = %v, want all 5 done", got)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Run ended %s after ingest finished, want within a few seconds", took)
		}
	})
}

func sampleID(prefix string, i int) string { return fmt.Sprintf("%s-%05d", prefix, i) }

// lostReplyStore commits its first claim but reports an error, as a
// connection dropping between the commit and the reply would.
type lostReplyStore struct {
	*fakeStore
	lost int
}

func (s *lostReplyStore) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	c, err := s.fakeStore.Claim(ctx, lane, n, owner, lease)
	if err == nil && len(c) > 0 && s.lost == 0 {
		s.lost = len(c)
		return nil, errors.New("read tcp: connection reset by peer")
	}
	return c, err
}

// TestLostClaimReplyIsReconciled: samples a lost claim leased are returned
// at once, not kept (and extended) forever by a dispatcher that never saw them.
func TestLostClaimReplyIsReconciled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &lostReplyStore{fakeStore: newFakeStore()}
		st.add("short", "s", 10)
		eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
		cfg := baseConfig(st, eps)
		cfg.Store = st
		cfg.Lease = time.Hour
		d := mustNew(t, cfg)
		start := time.Now()
		// Without the reconcile the lost samples stay leased for good and
		// Run never ends: bound it.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		if err := d.Run(ctx); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if st.lost == 0 {
			t.Fatal("no claim reply was lost; the test did not test anything")
		}
		if took := time.Since(start); took > time.Minute {
			t.Errorf("Run took %s: the lost claim's samples waited for their lease", took)
		}
		for i := range 10 {
			if s := st.get(sampleID("s", i)); s.state != store.Done || s.attempts != 1 {
				t.Errorf("%s: %s with %d attempts, want done with 1", s.ID, s.state, s.attempts)
			}
		}
		if c := d.Snapshot().Counters; c.Released < int64(st.lost) {
			t.Errorf("Released = %d, want at least the %d samples of the lost claim", c.Released, st.lost)
		}
	})
}
