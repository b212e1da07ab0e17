package dispatch

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
)

// TestObserveEveryAttempt: every request is reported once with its lane,
// endpoint, outcome and timings, failures with their class.
func TestObserveEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 6)
		tr := newTracker()
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if c.id == "s-00002" && c.n == 1 {
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Msg: "429"}
			}
			if c.id == "s-00004" {
				return llm.Result{}, &llm.Error{Class: llm.BadRequest, Msg: "400: context too long"}
			}
			return generate(ctx, c, 400*time.Millisecond, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		var mu sync.Mutex
		got := map[string]int{}
		cfg.Observe = func(a Attempt) {
			mu.Lock()
			defer mu.Unlock()
			got[a.Lane+" "+a.Endpoint+" "+a.Outcome]++
			if a.Outcome == OutcomeOK && (a.Duration != 400*time.Millisecond || a.TTFT != 100*time.Millisecond || a.CompletionTokens != 8) {
				t.Errorf("ok attempt %+v: want duration 400ms, ttft 100ms, 8 tokens", a)
			}
		}
		if err := mustNew(t, cfg).Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		want := map[string]int{"short http://a ok": 5, "short http://a retryable": 1, "short http://a bad-request": 1}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("observed attempts (-want +got):\n%s", diff)
		}
	})
}

// A request cancelled to move it, to shed load or as an unneeded backup is
// reported as such, not as the server-down error its cancellation looks like.
func TestObserveMovedAndShed(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
	cfg := baseConfig(newFakeStore(), eps)
	var got []string
	cfg.Observe = func(a Attempt) { got = append(got, a.Outcome) }
	d := mustNew(t, cfg)
	cancelled := &llm.Error{Class: llm.ServerDown, Msg: "context canceled"}
	for _, cause := range []error{errMoved, errShed, errPaused, errHedgeDropped, nil} {
		d.observe("short", "http://a", d.now(), llm.Result{}, cancelled, cause)
	}
	if diff := cmp.Diff([]string{OutcomeMoved, OutcomeShed, OutcomeCancelled, OutcomeUnneeded, "server-down"}, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
}
