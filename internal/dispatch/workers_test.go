package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/llm"
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
	return s.ClaimKept(ctx, lane, n, owner, lease, nil)
}

// ClaimKept loses its reply as Claim does: the dispatcher claims through
// it once it keeps a conversation's history.
func (s *lostReplyStore) ClaimKept(ctx context.Context, lane string, n int, owner string, lease time.Duration, kept []store.Kept) ([]store.Claimed, error) {
	c, err := s.fakeStore.ClaimKept(ctx, lane, n, owner, lease, kept)
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

// undoneStore loses its first Release (as a database crash loses a commit
// made without waiting for the disk) and fails its first completion (the
// crash, seen by the dispatcher).
type undoneStore struct {
	*fakeStore
	mu                  sync.Mutex
	undone, failed      bool
	releasesSwallowed   int
	completesFailedOnce int
}

func (s *undoneStore) Release(ctx context.Context, ids []string, owner string) error {
	s.mu.Lock()
	if !s.undone {
		s.undone = true
		s.releasesSwallowed = len(ids)
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return s.fakeStore.Release(ctx, ids, owner)
}

func (s *undoneStore) Commit(ctx context.Context, t store.Transition) error {
	s.mu.Lock()
	fail := t.Op == store.OpFinish && s.undone && !s.failed
	s.failed = s.failed || fail
	s.mu.Unlock()
	if fail {
		s.completesFailedOnce++
		return errors.New("server closed the connection unexpectedly")
	}
	return s.fakeStore.Commit(ctx, t)
}

// TestUndoneReleaseIsReconciled: a sample whose release a crash undid stays
// leased to this worker in the store; after the next store failure the
// dispatcher returns what it does not hold, so the sample is generated
// rather than held (and extended) for good.
func TestUndoneReleaseIsReconciled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &undoneStore{fakeStore: newFakeStore()}
		st.add("short", "s", 6)
		var mu sync.Mutex
		downOnce := false
		eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
			mu.Lock()
			first := !downOnce && c.id == "s-00002"
			downOnce = downOnce || first
			mu.Unlock()
			if first {
				return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "connection reset"}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Store = st
		cfg.Lease = time.Hour
		d := mustNew(t, cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		if err := d.Run(ctx); err != nil {
			t.Fatalf("Run: %v (a sample stayed leased to a worker that did not hold it)", err)
		}
		if st.releasesSwallowed == 0 || st.completesFailedOnce == 0 {
			t.Fatalf("the test did not undo a release and fail a commit (%d, %d)", st.releasesSwallowed, st.completesFailedOnce)
		}
		for i := range 6 {
			if s := st.get(sampleID("s", i)); s.state != store.Done {
				t.Errorf("%s: %s, want done", s.ID, s.state)
			}
		}
	})
}
