package dispatch

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

func TestJudgeBurn(t *testing.T) {
	tests := []struct {
		name string
		ev   burnEvidence
		want burnVerdict
	}{
		{"first failure", burnEvidence{distinct: 1, failures: 1, after: 10}, burnEndpoint},
		{"repeat, nothing answered since", burnEvidence{repeat: true, distinct: 3, failures: 5, after: 10}, burnEndpoint},
		{"repeat while others were answered: the sample's own", burnEvidence{repeat: true, servedSince: true, distinct: 1, failures: 1, after: 10}, burnSample},
		{"convicted before, failing alone at the end of the job", burnEvidence{repeat: true, convicted: true, alone: true, distinct: 1, failures: 3, after: 10}, burnSample},
		{"convicted before, but others fail too now", burnEvidence{repeat: true, convicted: true, distinct: 4, failures: 4, after: 10}, burnEndpoint},
		{"streak of distinct samples trips", burnEvidence{distinct: 10, failures: 10, after: 10}, burnTrip},
		{"repeats with nothing answered trip at twice the count", burnEvidence{repeat: true, distinct: 1, failures: 20, after: 10}, burnTrip},
		{"broken: always the endpoint's", burnEvidence{repeat: true, servedSince: true, broken: true, distinct: 1, failures: 1, after: 10}, burnEndpoint},
	}
	for _, tt := range tests {
		if got := judgeBurn(tt.ev); got != tt.want {
			t.Errorf("%s: judgeBurn(%+v) = %d, want %d", tt.name, tt.ev, got, tt.want)
		}
	}
}

func TestServerFault(t *testing.T) {
	tests := []struct {
		err     error
		wantKey string
		ok      bool
	}{
		{&llm.Error{Class: llm.Retryable, Status: 500, Msg: "internal boom 4711"}, "500 internal boom ####", true},
		{&llm.Error{Class: llm.Malformed, EndpointFault: true, Msg: "answered 200 with text/html"}, "0 answered ### with text/html", true},
		{&llm.Error{Class: llm.ServerDown, EndpointFault: true, Msg: "no response headers"}, "0 no response headers", true},
		{&llm.Error{Class: llm.Retryable, Status: 429}, "", false},
		{&llm.Error{Class: llm.Retryable, Msg: "past its budget"}, "", false},
		{&llm.Error{Class: llm.Malformed, Msg: "bad chunk"}, "", false},
		{&llm.Error{Class: llm.ServerDown, Msg: "connection refused"}, "", false},
		{errors.New("weird"), "", false},
	}
	for _, tt := range tests {
		key, ok := serverFault(tt.err)
		if key != tt.wantKey || ok != tt.ok {
			t.Errorf("serverFault(%v) = %q, %v; want %q, %v", tt.err, key, ok, tt.wantKey, tt.ok)
		}
	}
}

func TestBurnStreak(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s burnStreak
	s.add("a", "500 x", t0, time.Time{}, 10)
	s.add("b", "500 x", t0.Add(time.Second), time.Time{}, 10)
	s.add("a", "500 x", t0.Add(2*time.Second), t0.Add(-time.Second), 10) // an answer to a request sent before the streak
	if len(s.samples) != 2 || s.failures != 3 {
		t.Errorf("streak = %d samples, %d failures; want 2, 3", len(s.samples), s.failures)
	}
	s.add("c", "500 y", t0.Add(3*time.Second), time.Time{}, 10)
	if len(s.samples) != 1 || s.failures != 4 {
		t.Errorf("after another error: %d samples, %d failures; want 1 (a new count), 4 (any server error)", len(s.samples), s.failures)
	}
	s.add("d", "500 y", t0.Add(5*time.Second), t0.Add(4*time.Second), 10) // answered a request sent after the streak began
	if len(s.samples) != 1 || s.failures != 1 {
		t.Errorf("after an answer: %d samples, %d failures; want a new streak (1, 1)", len(s.samples), s.failures)
	}
}

// breakingServer answers its first `good` requests and then fails every
// one with err, until `recover` (0: for ever).
func breakingServer(good int64, err error, recoverAt time.Time) (script, *atomic.Int64) {
	var n atomic.Int64
	return func(ctx context.Context, c call1) (llm.Result, error) {
		i := n.Add(1)
		if i > good && (recoverAt.IsZero() || time.Now().Before(recoverAt)) {
			time.Sleep(20 * time.Millisecond)
			return llm.Result{}, err
		}
		return generate(ctx, c, time.Second, "stop")
	}, &n
}

// TestBrokenMidJob: a server that answers and then fails everything with
// the same 500 is paused as broken: no sample is dead-lettered or spends
// an attempt on it, and Run stops with a BrokenError once it has been
// broken for BrokenAfter, every unfinished sample pending.
func TestBrokenMidJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rows = 300
		st := newFakeStore()
		st.add("short", "s", rows)
		tr := newTracker()
		fn, sent := breakingServer(40, &llm.Error{Class: llm.Retryable, Status: 500, Msg: "internal boom"}, time.Time{})
		eps, _ := fleet(tr, fn, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 8, MaxTokens: 100}}
		cfg.PoisonAfter, cfg.BrokenAfter, cfg.MaxAttempts = 10, 2*time.Minute, 4
		d := mustNew(t, cfg)
		start := time.Now()
		err := d.Run(t.Context())
		var be *BrokenError
		if !errors.As(err, &be) {
			t.Fatalf("Run = %v, want a BrokenError", err)
		}
		took := time.Since(start)
		if !strings.Contains(err.Error(), "http://a: retryable (HTTP 500): internal boom") || !strings.Contains(err.Error(), "monitor.broken_after") {
			t.Errorf("error does not name the endpoint, its error and the setting: %v", err)
		}
		states := st.states()
		if states[store.Dead] != 0 || states[store.Done] != 40 || states[store.Pending] != rows-40 {
			t.Errorf("states = %v, want 40 done, %d pending, none dead", states, rows-40)
		}
		for i := range rows {
			if s := st.get(sampleID("s", i)); s.state == store.Pending && s.attempts != 0 {
				t.Errorf("%s: %d attempts spent on a broken server, want 0", s.ID, s.attempts)
			}
		}
		if took < 2*time.Minute || took > 3*time.Minute {
			t.Errorf("stopped after %s, want broken_after (2m) after it broke", took)
		}
		failed := sent.Load() - 40
		t.Logf("stopped after %s; %d requests failed with the 500 (%d before it broke), burnt %d: %v", took, failed, 40, d.Counters().Burnt, err)
		if failed > 40 {
			t.Errorf("%d requests to a broken server in 2m, want a streak (10) and a probe at a time (about 10 more)", failed)
		}
	})
}

// TestBrokenRecovers: a server broken for a minute comes back; its probe
// succeeds, the endpoint resumes and every sample is done exactly once,
// none dead, the broken time spending no attempt.
func TestBrokenRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rows = 200
		st := newFakeStore()
		st.add("short", "s", rows)
		tr := newTracker()
		fn, _ := breakingServer(30, &llm.Error{Class: llm.Malformed, EndpointFault: true, Msg: "chat: answered 200 with text/html, not an event stream"},
			time.Now().Add(90*time.Second))
		eps, _ := fleet(tr, fn, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 8, MaxTokens: 100}}
		cfg.PoisonAfter, cfg.BrokenAfter = 10, 5*time.Minute
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if diff := cmp.Diff(map[store.State]int{store.Done: rows}, st.states()); diff != "" {
			t.Errorf("states (-want +got):\n%s", diff)
		}
		for i := range rows {
			if s := st.get(sampleID("s", i)); s.attempts != 1 {
				t.Errorf("%s: %d attempts, want 1 (the answer)", s.ID, s.attempts)
			}
		}
		if e, _ := d.Endpoint("http://a"); !e.BrokenSince.IsZero() || e.Breaker != "closed" {
			t.Errorf("endpoint after recovery: broken since %v, breaker %s; want neither", e.BrokenSince, e.Breaker)
		}
		t.Logf("counters: %+v", d.Counters())
	})
}

// TestOwnServerErrorSpends: one prompt that the server always answers
// with a 500 while it answers the others is that sample's fault: it
// spends its attempts and is dead-lettered; the endpoint never breaks.
func TestOwnServerErrorSpends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rows = 60
		st := newFakeStore()
		st.add("short", "s", rows)
		tr := newTracker()
		bad := sampleID("s", 7)
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if c.id == bad {
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 500, Msg: "template error"}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.PoisonAfter, cfg.BrokenAfter = 10, time.Minute
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		s := st.get(bad)
		if s.state != store.Dead || s.attempts != cfg.MaxAttempts || !strings.Contains(s.reason, "template error") {
			t.Errorf("%s = %s, %d attempts, %q; want dead after %d attempts with the server's error", bad, s.state, s.attempts, s.reason, cfg.MaxAttempts)
		}
		if got := tr.callsOf(bad); got != cfg.MaxAttempts+1 {
			t.Errorf("%s sent %d times, want %d (the first failure is free)", bad, got, cfg.MaxAttempts+1)
		}
		if st.states()[store.Done] != rows-1 {
			t.Errorf("states = %v, want %d done", st.states(), rows-1)
		}
	})
}

// TestOneBrokenEndpointOfTwo: a broken endpoint beside a working one does
// not stop the run; the other finishes the job.
func TestOneBrokenEndpointOfTwo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rows = 200
		st := newFakeStore()
		st.add("short", "s", rows)
		tr := newTracker()
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if c.ep == "http://b" {
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 502 - 2, Msg: "internal boom"}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a", "http://b")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 8, MaxTokens: 100}}
		cfg.PoisonAfter, cfg.BrokenAfter = 10, 10*time.Second
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if diff := cmp.Diff(map[store.State]int{store.Done: rows}, st.states()); diff != "" {
			t.Errorf("states (-want +got):\n%s", diff)
		}
		if e, _ := d.Endpoint("http://b"); e.BrokenSince.IsZero() {
			t.Errorf("http://b was not judged broken: %+v", e)
		}
		t.Logf("requests to the broken endpoint: %d", tr.epCallsOf("http://b"))
	})
}

// TestBrokenWaitsForItsKeeper: a broken endpoint its keeper paused (a
// restart) does not stop the run; once resumed, broken_after runs again.
func TestBrokenWaitsForItsKeeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 100)
		tr := newTracker()
		fn, _ := breakingServer(10, &llm.Error{Class: llm.Retryable, Status: 500, Msg: "internal boom"}, time.Time{})
		eps, _ := fleet(tr, fn, "http://a")
		cfg := baseConfig(st, eps)
		cfg.PoisonAfter, cfg.BrokenAfter = 5, time.Minute
		d := mustNew(t, cfg)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- d.Run(t.Context()) }()
		time.Sleep(30 * time.Second)
		if e, _ := d.Endpoint("http://a"); e.BrokenSince.IsZero() {
			t.Fatalf("not broken after 30 s of 500s: %+v", e)
		}
		d.Pause("http://a", "RESTARTING")
		time.Sleep(5 * time.Minute) // a long restart: no stop meanwhile
		select {
		case err := <-done:
			t.Fatalf("Run ended while its endpoint was paused by its keeper: %v", err)
		default:
		}
		d.Resume("http://a")
		err := <-done
		var be *BrokenError
		if !errors.As(err, &be) {
			t.Fatalf("Run = %v, want a BrokenError", err)
		}
		if took := time.Since(start); took < 6*time.Minute+30*time.Second {
			t.Errorf("stopped %s after the start, want broken_after (1m) after the resume at 5m30s", took)
		}
	})
}
