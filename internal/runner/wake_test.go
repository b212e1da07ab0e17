package runner

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// lateIngestStore holds the first ingest commit back by delay, so the
// dispatcher has already found the store empty, and remembers when the
// first commit returned.
type lateIngestStore struct {
	store.Store
	delay     time.Duration
	committed atomic.Int64 // unix nanos of the first committed batch
}

func (s *lateIngestStore) Ingest(ctx context.Context, samples []store.NewSample) (int, error) {
	if s.committed.Load() == 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	n, err := s.Store.Ingest(ctx, samples)
	if err == nil && n > 0 {
		s.committed.CompareAndSwap(0, time.Now().UnixNano())
	}
	return n, err
}

// TestIngestWakesDispatch runs a job whose first batch is committed after
// the dispatcher found nothing to claim, and logs the time from that commit
// to the first request an endpoint receives (a measurement, not an
// assertion: the machine's load decides it). Every sample is still done
// exactly once.
func TestIngestWakesDispatch(t *testing.T) {
	proxy := simProxy(t, slowSim())
	var first atomic.Int64 // unix nanos of the first chat request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			first.CompareAndSwap(0, time.Now().UnixNano())
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	const trials, n = 3, 8
	var total time.Duration
	for i := range trials {
		first.Store(0)
		spec := externalJob(t, srv.URL, "sglang", "m", n, "{heartbeat_every: 100ms}")
		st := &lateIngestStore{Store: openStore(t, spec), delay: 2500 * time.Millisecond}
		sum, err := Run(context.Background(), Options{Spec: spec, Store: st, Logger: testLogger(t), ProgressEvery: time.Hour, NoExport: true})
		if err != nil {
			t.Fatalf("trial %d: run: %v", i, err)
		}
		if sum.Final.Total.Done != n {
			t.Fatalf("trial %d: done %d of %d", i, sum.Final.Total.Done, n)
		}
		c, f := st.committed.Load(), first.Load()
		if c == 0 || f == 0 {
			t.Fatalf("trial %d: commit at %d, first request at %d: want both", i, c, f)
		}
		gap := time.Duration(f - c)
		total += gap
		t.Logf("trial %d: ingest commit to first dispatch %s", i, gap)
	}
	t.Logf("ingest commit to first dispatch: mean %s over %d trials", total/trials, trials)
}
