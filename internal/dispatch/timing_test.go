package dispatch

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/llm"
)

// TestLaneTail: while requests are in flight the snapshot says how long
// they are expected to take still, from the lane's answered durations and
// the requests' ages; the mean duration is there for queued work.
func TestLaneTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 5)
		release := make(chan struct{})
		eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
			if c.id == "s-00004" { // the last one is a long outlier
				select {
				case <-release:
				case <-ctx.Done():
				}
				return llm.Result{Content: "x", FinishReason: "stop", Duration: 30 * time.Second}, nil
			}
			time.Sleep(2 * time.Second)
			return llm.Result{Content: "x", FinishReason: "stop", Duration: 2 * time.Second}, nil
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes[0].Concurrency = 5
		d := mustNew(t, cfg)
		if got := d.Snapshot().Lanes[0]; got.MeanDuration != 0 || got.Tail != 0 {
			t.Fatalf("before any request: %+v, want no timing", got)
		}
		wait := runAsync(t.Context(), d)
		time.Sleep(3 * time.Second) // four answered after 2s, the outlier 3s old
		synctest.Wait()
		got := d.Snapshot().Lanes[0]
		if got.MeanDuration != 2*time.Second {
			t.Errorf("MeanDuration = %s, want 2s", got.MeanDuration)
		}
		// Older than every answered request: expected to run as long again.
		if got.Tail != 3*time.Second {
			t.Errorf("Tail with a 3s-old request and answers of 2s = %s, want 3s", got.Tail)
		}
		close(release)
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		if got := d.Snapshot().Lanes[0]; got.Tail != 0 {
			t.Errorf("Tail with nothing in flight = %s, want 0", got.Tail)
		}
	})
}

func TestResidual(t *testing.T) {
	var r recentDurations
	for _, d := range []time.Duration{1, 1, 1, 1, 10} {
		r.add(d * time.Second)
	}
	for _, tc := range []struct{ age, want time.Duration }{
		{0, 2800 * time.Millisecond}, // the mean
		{2 * time.Second, 8 * time.Second},
		{12 * time.Second, 12 * time.Second}, // older than all: as long again
	} {
		if got := r.residual(tc.age); got != tc.want {
			t.Errorf("residual(%s) = %s, want %s", tc.age, got, tc.want)
		}
	}
	if got := r.tail(0, 2*time.Second, 3); got != 8*time.Second {
		t.Errorf("tail(0, 2s) = %s, want the longer residual 8s", got)
	}
	for range recentSize {
		r.add(time.Second)
	}
	if r.mean() != time.Second {
		t.Errorf("after %d answers of 1s the mean is %s, want 1s: old durations must leave the window", recentSize, r.mean())
	}
}
