package dispatch

import (
	"context"
	"errors"
	"fmt"
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
		{"first failure", burnEvidence{distinct: 1, samples: 1, failures: 1, tries: 1, after: 10}, burnEndpoint},
		{"repeat, nothing answered since", burnEvidence{repeat: true, distinct: 3, samples: 3, failures: 5, tries: 2, after: 10}, burnEndpoint},
		{"repeat while others were answered: the sample's own", burnEvidence{repeat: true, servedSince: true, distinct: 1, samples: 1, failures: 1, tries: 1, after: 10}, burnSample},
		{"streak of distinct samples trips", burnEvidence{distinct: 10, samples: 10, failures: 10, tries: 1, after: 10}, burnTrip},
		{"streak of distinct samples trips at the end of a lane too", burnEvidence{lastLeft: true, distinct: 10, samples: 10, failures: 10, tries: 1, after: 10}, burnTrip},
		// Other work waits, yet the same few deferred samples keep failing
		// (a slow failure lets them come back first): the server's.
		{"other work waits, few samples fail twice the count", burnEvidence{repeat: true, distinct: 2, samples: 2, failures: 20, tries: 10, after: 10}, burnTrip},
		{"other work waits, below twice the count", burnEvidence{repeat: true, distinct: 2, samples: 2, failures: 19, tries: 10, after: 10}, burnEndpoint},
		// Nothing else left to send: a few samples never break the endpoint.
		{"one sample failing alone, below the count", burnEvidence{repeat: true, lastLeft: true, distinct: 1, samples: 1, failures: 9, tries: 9, after: 10}, burnEndpoint},
		{"one sample failing alone at the count: its own", burnEvidence{repeat: true, lastLeft: true, distinct: 1, samples: 1, failures: 10, tries: 10, after: 10}, burnSample},
		{"one sample failing alone far past the count: its own, no trip", burnEvidence{repeat: true, lastLeft: true, distinct: 1, samples: 1, failures: 40, tries: 40, after: 10}, burnSample},
		{"a few samples left, failing together: not yet", burnEvidence{repeat: true, lastLeft: true, distinct: 3, samples: 3, failures: 25, tries: 9, after: 10}, burnEndpoint},
		{"a few samples left, each alone too long: its own", burnEvidence{repeat: true, lastLeft: true, distinct: 3, samples: 3, failures: 30, tries: 10, after: 10}, burnSample},
		{"broken: always the endpoint's", burnEvidence{repeat: true, servedSince: true, broken: true, distinct: 1, samples: 1, failures: 12, tries: 12, after: 10}, burnEndpoint},
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
		{&llm.Error{Class: llm.Retryable, Status: 503, Msg: "busy"}, "503 busy", true},
		{&llm.Error{Class: llm.Backpressure, Status: 503, Msg: "busy"}, "", false},
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
		// The poison guard's refusals are the same server errors (plus
		// 401/403/404, none here): one rule, not two that drift.
		if isRefusal(tt.err) != ok {
			t.Errorf("isRefusal(%v) = %v, serverFault says %v", tt.err, isRefusal(tt.err), ok)
		}
	}
}

func TestBurnStreak(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s burnStreak
	s.add("a", "500 x", t0, time.Time{}, 10)
	s.add("b", "500 x", t0.Add(time.Second), time.Time{}, 10)
	s.add("a", "500 x", t0.Add(2*time.Second), t0.Add(-time.Second), 10) // an answer to a request sent before the streak
	if len(s.same) != 2 || len(s.tries) != 2 || s.tries["a"] != 2 {
		t.Errorf("streak = %d same, %d samples, a tried %d; want 2, 2, 2", len(s.same), len(s.tries), s.tries["a"])
	}
	s.add("c", "500 y", t0.Add(3*time.Second), time.Time{}, 10)
	if len(s.same) != 1 || len(s.tries) != 3 {
		t.Errorf("after another error: %d same, %d samples; want 1 (a new count), 3 (any server error)", len(s.same), len(s.tries))
	}
	s.add("d", "500 y", t0.Add(5*time.Second), t0.Add(4*time.Second), 10) // answered a request sent after the streak began
	if len(s.same) != 1 || len(s.tries) != 1 || s.tries["a"] != 0 {
		t.Errorf("after an answer: %d same, %d samples, a tried %d; want a new streak (1, 1, 0)", len(s.same), len(s.tries), s.tries["a"])
	}
	for i := range 30 { // bounded: twice the count of samples, but a known one keeps counting
		s.add(fmt.Sprint("n", i), "500 y", t0.Add(6*time.Second), time.Time{}, 10)
		s.add("d", "500 y", t0.Add(6*time.Second), time.Time{}, 10)
	}
	if len(s.same) != 10 || len(s.tries) != 20 || s.tries["d"] != 31 || s.failures != 61 {
		t.Errorf("bounded streak: %d same, %d samples, d tried %d, %d failures; want 10, 20, 31, 61", len(s.same), len(s.tries), s.tries["d"], s.failures)
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
		cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter, cfg.MaxAttempts = 10, 10, 2*time.Minute, 4
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
		cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 10, 10, 5*time.Minute
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
		cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 10, 10, time.Minute
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
		cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 10, 10, 10*time.Second
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
		cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 5, 5, time.Minute
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

// TestOwnServerErrorAtTheEnd: the job's last samples fail with their own
// 500 and nothing else is left to compare with. Each is judged its own
// after BrokenStreak failures alone (attempts spent, dead-lettered with
// the server's error and the evidence); the endpoint never breaks and Run
// ends without error.
func TestOwnServerErrorAtTheEnd(t *testing.T) {
	const rows = 60
	for _, badRows := range [][]int{{rows - 1}, {rows - 2, rows - 1}} {
		t.Run(fmt.Sprint(len(badRows), " bad"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				st.add("short", "s", rows)
				tr := newTracker()
				bad := map[string]bool{}
				for _, i := range badRows {
					bad[sampleID("s", i)] = true
				}
				eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
					if bad[c.id] {
						time.Sleep(100 * time.Millisecond)
						return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 500, Msg: "template error"}
					}
					return generate(ctx, c, time.Second, "stop")
				}, "http://a")
				cfg := baseConfig(st, eps)
				cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 10, 10, time.Minute
				d := mustNew(t, cfg)
				err := d.Run(t.Context())
				t.Logf("Run = %v; states %v", err, st.states())
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				for id := range bad {
					s := st.get(id)
					t.Logf("%s: %s, %d attempts, sent %d times: %s", id, s.state, s.attempts, tr.callsOf(id), s.reason)
					if s.state != store.Dead || s.attempts != cfg.MaxAttempts || !strings.Contains(s.reason, "template error") ||
						!strings.Contains(s.reason, "failed 12 times in a row with nothing else answered") {
						t.Errorf("%s = %s, %d attempts, %q; want dead after %d attempts with the server's error and the evidence", id, s.state, s.attempts, s.reason, cfg.MaxAttempts)
					}
					if got, want := tr.callsOf(id), cfg.BrokenStreak-1+cfg.MaxAttempts; got != want {
						t.Errorf("%s sent %d times, want %d (free until it failed alone %d times)", id, got, want, cfg.BrokenStreak)
					}
				}
				if e, _ := d.Endpoint("http://a"); !e.BrokenSince.IsZero() {
					t.Errorf("endpoint judged broken by %d samples: %+v", len(bad), e)
				}
				if st.states()[store.Done] != rows-len(bad) {
					t.Errorf("states = %v, want %d done", st.states(), rows-len(bad))
				}
			})
		})
	}
}

// TestBurnGuardWithoutPoisonGuard: the poison guard off (PoisonAfter 0)
// leaves the burn guard on: a server broken mid-job dead-letters nothing
// and stops Run; BrokenStreak 0 turns it off, and then the server errors
// spend attempts.
func TestBurnGuardWithoutPoisonGuard(t *testing.T) {
	for _, streak := range []int{10, 0} {
		t.Run(fmt.Sprint("broken_streak ", streak), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const rows = 100
				st := newFakeStore()
				st.add("short", "s", rows)
				tr := newTracker()
				fn, _ := breakingServer(20, &llm.Error{Class: llm.Retryable, Status: 500, Msg: "internal boom"}, time.Time{})
				eps, _ := fleet(tr, fn, "http://a")
				cfg := baseConfig(st, eps)
				cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 0, streak, time.Minute
				err := mustNew(t, cfg).Run(t.Context())
				states := st.states()
				t.Logf("Run = %v; states %v", err, states)
				var be *BrokenError
				switch {
				case streak > 0 && (!errors.As(err, &be) || states[store.Dead] != 0 || states[store.Pending] != rows-20):
					t.Errorf("guard on: Run = %v, states %v; want a BrokenError, none dead, %d pending", err, states, rows-20)
				case streak == 0 && (err != nil || states[store.Dead] != rows-20):
					t.Errorf("guard off: Run = %v, states %v; want every failing sample dead after its attempts", err, states)
				}
			})
		})
	}
}

// TestServerDownBurnAgreesWithCut: a server-down error blamed on the
// endpoint (no headers) on distinct samples, one at a time. While others
// stream tokens the cut rule keeps the breaker closed (alive), so the burn
// guard must not call the endpoint broken (DOWN while traffic flows); with
// nothing streaming it is an outage, and the streak breaks it.
func TestServerDownBurnAgreesWithCut(t *testing.T) {
	for _, streaming := range []bool{true, false} {
		t.Run(fmt.Sprint("others streaming ", streaming), func(t *testing.T) {
			st := newFakeStore()
			eps, _ := fleet(newTracker(), nil, "http://a")
			cfg := baseConfig(st, eps)
			cfg.BrokenStreak = 3
			d := mustNew(t, cfg)
			e := d.eps[0]
			noHeaders := &llm.Error{Class: llm.ServerDown, EndpointFault: true, Msg: "chat: no response headers"}
			t0 := time.Unix(1000, 0)
			var v verdict
			for i := range 5 {
				start := t0.Add(time.Duration(i) * 10 * time.Second)
				cl := &call{ep: e, start: start, tokens0: e.tokens.Load()}
				if streaming {
					e.tokens.Add(100) // another request's tokens while this one ran
				}
				v = d.refine(cl, store.Claimed{ID: fmt.Sprint("s", i)}, verdict{out: outRelease, class: llm.ServerDown}, noHeaders, start.Add(time.Second))
			}
			broken := !e.brokenSince.IsZero()
			t.Logf("alive %v, broken %v, streak %d samples", v.alive, broken, len(e.streak.same))
			if v.alive == broken {
				t.Errorf("alive %v and broken %v: the breaker and the burn guard disagree", v.alive, broken)
			}
			if broken != !streaming {
				t.Errorf("broken = %v with others streaming %v", broken, streaming)
			}
			if len(e.streak.same) != 3 {
				t.Errorf("streak counts %d samples, want 3 (bounded by the count) either way", len(e.streak.same))
			}
		})
	}
}

// TestBrokenSlowFailuresFewSlots: a server that breaks and then takes 5 s
// to fail each request, behind a lane of 2: the same two deferred samples
// come back before any new one, so the streak never holds BrokenStreak
// distinct samples. With other work waiting, twice the count of failures
// still breaks the endpoint: nothing is dead-lettered and Run stops.
func TestBrokenSlowFailuresFewSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rows, good = 100, 20
		st := newFakeStore()
		st.add("short", "s", rows)
		tr := newTracker()
		var n atomic.Int64
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if n.Add(1) > good {
				time.Sleep(5 * time.Second)
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 500, Msg: "upstream timed out"}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 2, MaxTokens: 100}}
		cfg.PoisonAfter, cfg.BrokenStreak, cfg.BrokenAfter = 10, 10, time.Minute
		err := mustNew(t, cfg).Run(t.Context())
		states := st.states()
		t.Logf("Run = %v; states %v; %d requests", err, states, n.Load())
		var be *BrokenError
		if !errors.As(err, &be) || states[store.Dead] != 0 || states[store.Pending] != rows-good {
			t.Errorf("Run = %v, states %v; want a BrokenError, none dead, %d pending", err, states, rows-good)
		}
	})
}
