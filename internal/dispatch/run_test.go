package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

func TestLaneLimitsNeverExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 150)
		st.add("long", "l", 60)
		tr := newTracker()
		rnd := rand.New(rand.NewPCG(1, 2))
		var mu sync.Mutex
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			mu.Lock()
			d := time.Duration(1+rnd.IntN(50)) * 100 * time.Millisecond
			mu.Unlock()
			return generate(ctx, c, d, "stop")
		}, "http://a", "http://b", "http://c")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 7, MaxTokens: 100}, {Name: "long", Concurrency: 3, MaxTokens: 1000}}
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		got := map[int]int{100: tr.peak[100], 1000: tr.peak[1000]}
		if diff := cmp.Diff(map[int]int{100: 7, 1000: 3}, got); diff != "" {
			t.Errorf("peak concurrency by max_tokens (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[store.State]int{store.Done: 210}, st.states()); diff != "" {
			t.Errorf("final states (-want +got):\n%s", diff)
		}
		snap := d.Snapshot()
		wantLanes := []LaneStats{{Name: "short", InFlight: 0, Limit: 7, Answered: 150}, {Name: "long", InFlight: 0, Limit: 3, Answered: 60}}
		if diff := cmp.Diff(wantLanes, snap.Lanes, cmpopts.IgnoreFields(LaneStats{}, "MeanDuration")); diff != "" {
			t.Errorf("lane stats (-want +got):\n%s", diff)
		}
		var tokens int64
		for _, e := range snap.Endpoints {
			tokens += e.TokensTotal
			if e.LastTokenAt.IsZero() {
				t.Errorf("endpoint %s: LastTokenAt is zero after streaming", e.URL)
			}
		}
		if tokens != 210*8 {
			t.Errorf("TokensTotal over endpoints = %d, want %d", tokens, 210*8)
		}
	})
}

func TestSetLaneLimitWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 100)
		tr := newTracker()
		eps, _ := fleet(tr, ok(time.Second), "http://a")
		d := mustNew(t, baseConfig(st, eps)) // short lane: concurrency 4
		wait := runAsync(t.Context(), d)
		time.Sleep(5 * time.Second)
		if err := d.SetLaneLimit("short", 9); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		tr.mu.Lock()
		cur := tr.cur[100]
		tr.mu.Unlock()
		if cur != 9 {
			t.Errorf("in flight after raising the limit to 9 = %d, want 9", cur)
		}
		if err := d.SetLaneLimit("short", 2); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // the 9 in flight finish; only 2 start again
		tr.mu.Lock()
		tr.peak[100] = 0
		tr.mu.Unlock()
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if got := tr.peak[100]; got > 2 {
			t.Errorf("peak after lowering the limit to 2 = %d, want <= 2", got)
		}
	})
}

func TestBalancingLeastOutstanding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 200)
		tr := newTracker()
		eps, fakes := fleet(tr, ok(time.Second), "http://fast", "http://slow")
		fakes["http://slow"].setScript(ok(10 * time.Second))
		cfg := baseConfig(st, eps)
		cfg.Lanes[0].Concurrency = 8
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		fast, slow := tr.epCallsOf("http://fast"), tr.epCallsOf("http://slow")
		if fast+slow != 200 || slow*3 > fast {
			t.Errorf("requests fast=%d slow=%d, want all 200 sent and the slow endpoint to get well under a quarter", fast, slow)
		}
	})
}

func TestServerDownReleasesAndBreaks(t *testing.T) {
	down := func(ctx context.Context, c call1) (llm.Result, error) {
		return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "connection refused"}
	}
	t.Run("other endpoint takes over", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 40)
			tr := newTracker()
			eps, _ := fleet(tr, ok(time.Second), "http://up", "http://down")
			eps[1].Client.(*fakeChatter).setScript(down)
			d := mustNew(t, baseConfig(st, eps))
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i := range 40 {
				if s := st.get(fmt.Sprintf("s-%05d", i)); s.state != store.Done || s.attempts != 1 || s.result.Endpoint != "http://up" {
					t.Errorf("%s: state %s attempts %d endpoint %s, want done, 1 attempt (the successful one), on http://up", s.ID, s.state, s.attempts, s.result.Endpoint)
				}
			}
			snap := d.Snapshot()
			downStats := snap.Endpoints[1]
			if downStats.Errors["server-down"] == 0 || downStats.Breaker == "closed" {
				t.Errorf("down endpoint stats = %+v, want server-down errors and a breaker not closed", downStats)
			}
			if snap.Counters.ServerDown == 0 || snap.Counters.Released != snap.Counters.ServerDown {
				t.Errorf("counters = %+v, want ServerDown > 0 and Released == ServerDown", snap.Counters)
			}
			// Half-open probes back off: far fewer requests than samples.
			if n := tr.epCallsOf("http://down"); n > 8 {
				t.Errorf("requests to the down endpoint = %d, want a few probes", n)
			}
		})
	})
	t.Run("single endpoint recovers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 20)
			tr := newTracker()
			start := time.Now()
			recoverAt := start.Add(10 * time.Second)
			eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
				if time.Now().Before(recoverAt) {
					return down(ctx, c)
				}
				return generate(ctx, c, time.Second, "stop")
			}, "http://a")
			d := mustNew(t, baseConfig(st, eps))
			wait := runAsync(t.Context(), d)

			time.Sleep(2 * time.Second)
			synctest.Wait()
			snap := d.Snapshot().Endpoints[0]
			if snap.Breaker == "closed" || snap.BreakerOpenUntil.IsZero() {
				t.Errorf("during the outage: breaker %s until %v, want open", snap.Breaker, snap.BreakerOpenUntil)
			}
			if err := wait(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i := range 20 {
				if s := st.get(fmt.Sprintf("s-%05d", i)); s.state != store.Done || s.attempts != 1 {
					t.Errorf("%s: state %s attempts %d, want done with 1 attempt (the outage spent none)", s.ID, s.state, s.attempts)
				}
			}
			snap = d.Snapshot().Endpoints[0]
			if snap.Breaker != "closed" || !snap.BreakerOpenUntil.IsZero() {
				t.Errorf("after recovery: breaker %s until %v, want closed", snap.Breaker, snap.BreakerOpenUntil)
			}
			// Cooldowns 1, 2, 4, 8 s: the probe at 15 s sees the recovery at 10 s;
			// the 20 one-second requests at concurrency 4 take 5 s more.
			if took := time.Since(start); took > 25*time.Second {
				t.Errorf("job took %v of fake time, want the breaker to probe within its doubling cooldowns", took)
			}
		})
	})
}

func TestPauseCancelsAndResumeContinues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 30)
		tr := newTracker()
		eps, _ := fleet(tr, ok(10*time.Second), "http://a")
		d := mustNew(t, baseConfig(st, eps))
		wait := runAsync(t.Context(), d)

		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := d.Snapshot().Endpoints[0].InFlight; got != 4 {
			t.Fatalf("in flight before pause = %d, want 4", got)
		}
		d.Pause("http://a", "process exited: signal killed")
		synctest.Wait()
		snap := d.Snapshot()
		e := snap.Endpoints[0]
		if !e.Paused || e.PauseReason != "process exited: signal killed" || e.InFlight != 0 {
			t.Errorf("after pause: %+v, want paused with reason and nothing in flight", e)
		}
		if snap.Counters.Released != 4 || len(e.Errors) != 0 || snap.Counters.Done != 0 {
			t.Errorf("after pause: counters %+v errors %v, want 4 released and no errors", snap.Counters, e.Errors)
		}
		calls := tr.epCallsOf("http://a")
		time.Sleep(time.Minute)
		if got := tr.epCallsOf("http://a"); got != calls {
			t.Errorf("requests while paused: %d new, want 0", got-calls)
		}
		states := st.states()
		if states[store.Pending] != 30 {
			t.Errorf("states while paused = %v, want all 30 pending", states)
		}

		d.Resume("http://a")
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i := range 30 {
			if s := st.get(fmt.Sprintf("s-%05d", i)); s.state != store.Done || s.attempts != 1 {
				t.Errorf("%s: state %s attempts %d, want done with 1 attempt (the pause spent none)", s.ID, s.state, s.attempts)
			}
		}
		if e := d.Snapshot().Endpoints[0]; e.Paused || e.PauseReason != "" {
			t.Errorf("after resume: %+v, want not paused", e)
		}
	})
}

func TestPauseBeforeRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 5)
		tr := newTracker()
		eps, _ := fleet(tr, ok(time.Second), "http://a")
		d := mustNew(t, baseConfig(st, eps))
		d.Pause("http://a", "starting")
		d.Pause("http://unknown", "ignored")
		wait := runAsync(t.Context(), d)
		time.Sleep(30 * time.Second)
		if n := tr.epCallsOf("http://a"); n != 0 {
			t.Errorf("requests before Resume = %d, want 0", n)
		}
		if got := st.states(); got[store.Leased] != 0 {
			t.Errorf("states with every endpoint paused = %v, want nothing leased", got)
		}
		d.Resume("http://a")
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if got := st.states(); got[store.Done] != 5 {
			t.Errorf("states = %v, want 5 done", got)
		}
	})
}

func TestRetryOutcomes(t *testing.T) {
	tests := []struct {
		name         string
		fail         func(n int) error // error for the n-th send of a sample, nil = succeed
		wantState    store.State
		wantAttempts int // in the store at the end; finishing spends one too
		wantCalls    int
		wantReason   string
		wantCounters Counters
	}{
		{
			name: "retry then success",
			fail: func(n int) error {
				if n <= 2 {
					return &llm.Error{Class: llm.Retryable, Status: 429, Msg: "too many requests"}
				}
				return nil
			},
			wantState: store.Done, wantAttempts: 3, wantCalls: 3,
			wantCounters: Counters{Done: 1, Retried: 2},
		},
		{
			name: "malformed then success",
			fail: func(n int) error {
				if n == 1 {
					return &llm.Error{Class: llm.Malformed, Msg: "bad SSE line"}
				}
				return nil
			},
			wantState: store.Done, wantAttempts: 2, wantCalls: 2,
			wantCounters: Counters{Done: 1, Retried: 1},
		},
		{
			name: "retries exhausted",
			fail: func(n int) error {
				return &llm.Error{Class: llm.Retryable, Status: 500, Msg: fmt.Sprintf("boom %d", n)}
			},
			wantState: store.Dead, wantAttempts: 3, wantCalls: 3, wantReason: "3 attempts, last: retryable (HTTP 500): boom 3",
			wantCounters: Counters{Retried: 2, DeadLettered: 1},
		},
		{
			name:      "unclassified error counts as retryable",
			fail:      func(n int) error { return errors.New("weird") },
			wantState: store.Dead, wantAttempts: 3, wantCalls: 3, wantReason: "3 attempts, last: weird",
			wantCounters: Counters{Retried: 2, DeadLettered: 1},
		},
		{
			name: "bad request dead after one try",
			fail: func(n int) error {
				return &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "This model's maximum context length is 4096 tokens"}
			},
			wantState: store.Dead, wantAttempts: 1, wantCalls: 1,
			wantReason:   "bad-request (HTTP 400): This model's maximum context length is 4096 tokens",
			wantCounters: Counters{DeadLettered: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				st.add("short", "s", 1)
				tr := newTracker()
				eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
					if err := tt.fail(c.n); err != nil {
						return llm.Result{}, err
					}
					return generate(ctx, c, time.Second, "stop")
				}, "http://a")
				d := mustNew(t, baseConfig(st, eps))
				if err := d.Run(t.Context()); err != nil {
					t.Fatalf("Run: %v", err)
				}
				s := st.get("s-00000")
				if s.state != tt.wantState || s.attempts != tt.wantAttempts || s.reason != tt.wantReason {
					t.Errorf("sample = %s, %d attempts, reason %q; want %s, %d, %q", s.state, s.attempts, s.reason, tt.wantState, tt.wantAttempts, tt.wantReason)
				}
				if got := tr.callsOf("s-00000"); got != tt.wantCalls {
					t.Errorf("requests = %d, want %d", got, tt.wantCalls)
				}
				if diff := cmp.Diff(tt.wantCounters, d.Snapshot().Counters); diff != "" {
					t.Errorf("counters (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestRetryWaitsForNotBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 50)
		tr := newTracker()
		var mu sync.Mutex
		sent := map[string][]time.Time{}
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			mu.Lock()
			sent[c.id] = append(sent[c.id], time.Now())
			mu.Unlock()
			if c.n == 1 {
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 429}
			}
			return generate(ctx, c, 0, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.BaseDelay = 10 * time.Second
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		var spread []time.Duration
		for id, ts := range sent {
			if len(ts) != 2 {
				t.Fatalf("%s sent %d times, want 2", id, len(ts))
			}
			gap := ts[1].Sub(ts[0])
			// Full jitter within [0, 10 s), claimed at most one poll (1 s) late.
			if gap < 0 || gap > 11*time.Second {
				t.Errorf("%s: retry after %v, want within [0, 11s]", id, gap)
			}
			spread = append(spread, gap)
		}
		distinct := map[time.Duration]bool{}
		for _, g := range spread {
			distinct[g.Truncate(time.Second)] = true
		}
		if len(distinct) < 3 {
			t.Errorf("retry gaps fall in %d distinct seconds, want jitter to spread them", len(distinct))
		}
	})
}

func TestTruncation(t *testing.T) {
	finishBy := func(ctx context.Context, c call1) (llm.Result, error) {
		if c.req.MaxTokens == 100 {
			return generate(ctx, c, time.Second, "length")
		}
		return generate(ctx, c, 3*time.Second, "stop")
	}
	t.Run("escalates short to long", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 10)
			tr := newTracker()
			eps, _ := fleet(tr, finishBy, "http://a")
			cfg := baseConfig(st, eps)
			cfg.Lanes = []LaneConfig{
				{Name: "short", Concurrency: 2, MaxTokens: 100, EscalateTo: "long"},
				{Name: "long", Concurrency: 2, MaxTokens: 16000},
			}
			d := mustNew(t, cfg)
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i := range 10 {
				s := st.get(fmt.Sprintf("s-%05d", i))
				if s.state != store.Done || s.Lane != "long" || s.attempts != 1 || s.result.FinishReason != "stop" {
					t.Errorf("%s: %s in %s, %d attempts, finish %q; want done in long, 1 attempt (escalation spends none), stop", s.ID, s.state, s.Lane, s.attempts, s.result.FinishReason)
				}
			}
			if diff := cmp.Diff(Counters{Done: 10, Escalated: 10}, d.Snapshot().Counters); diff != "" {
				t.Errorf("counters (-want +got):\n%s", diff)
			}
			// Per lane, for the views' ETA: every short answer escalated.
			var got [][3]any
			for _, l := range d.Snapshot().Lanes {
				got = append(got, [3]any{l.Name + ">" + l.EscalateTo, l.Answered, l.Escalated})
			}
			if diff := cmp.Diff([][3]any{{"short>long", int64(10), int64(10)}, {"long>", int64(10), int64(0)}}, got); diff != "" {
				t.Errorf("lanes' answered and escalated (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("no bigger lane keeps it truncated", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 10)
			tr := newTracker()
			eps, _ := fleet(tr, finishBy, "http://a")
			d := mustNew(t, baseConfig(st, eps))
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i := range 10 {
				s := st.get(fmt.Sprintf("s-%05d", i))
				if s.state != store.Done || s.Lane != "short" || s.result.FinishReason != "length" {
					t.Errorf("%s: %s in %s finish %q; want done in short with length", s.ID, s.state, s.Lane, s.result.FinishReason)
				}
			}
			if diff := cmp.Diff(Counters{Done: 10, Truncated: 10}, d.Snapshot().Counters); diff != "" {
				t.Errorf("counters (-want +got):\n%s", diff)
			}
		})
	})
}

func TestStoredResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 1)
		eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
			return llm.Result{
				Content: "hi", ReasoningContent: "think", FinishReason: "stop", Model: "m",
				Usage: llm.Usage{PromptTokens: 11, CompletionTokens: 22, TotalTokens: 33},
				TTFT:  50 * time.Millisecond, Duration: 2 * time.Second,
			}, nil
		}, "http://a")
		d := mustNew(t, baseConfig(st, eps))
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		r := st.get("s-00000").result
		var resp map[string]any
		if err := json.Unmarshal(r.Response, &resp); err != nil {
			t.Fatalf("stored response is not JSON: %v", err)
		}
		if resp["endpoint"] != "http://a" || resp["content"] != "hi" || resp["reasoning_content"] != "think" || resp["finish_reason"] != "stop" {
			t.Errorf("stored response = %s, want content, reasoning, finish_reason and endpoint", r.Response)
		}
		r.Response = nil
		want := store.Result{FinishReason: "stop", PromptTokens: 11, CompletionTokens: 22, Endpoint: "http://a",
			Duration: 2 * time.Second, TTFT: 50 * time.Millisecond}
		if diff := cmp.Diff(want, r); diff != "" {
			t.Errorf("stored result (-want +got):\n%s", diff)
		}
	})
}

func TestDrainOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 20)
		tr := newTracker()
		// Even samples finish in 5 s, odd ones would take 10 minutes.
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			var i int
			fmt.Sscanf(c.id, "s-%d", &i)
			if i%2 == 0 {
				return generate(ctx, c, 5*time.Second, "stop")
			}
			return generate(ctx, c, 10*time.Minute, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.DrainTimeout = 20 * time.Second
		d := mustNew(t, cfg)
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAsync(ctx, d)
		time.Sleep(time.Second) // s-0..s-3 in flight
		cancel()
		start := time.Now()
		if err := wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		if took := time.Since(start); took != 20*time.Second {
			t.Errorf("drain took %v, want the 20s DrainTimeout (the slow requests never finish)", took)
		}
		// Finished ones spent their attempt; cancelled ones spent none.
		want := []struct {
			id       string
			state    store.State
			attempts int
		}{{"s-00000", store.Done, 1}, {"s-00001", store.Pending, 0}, {"s-00002", store.Done, 1}, {"s-00003", store.Pending, 0}}
		for _, w := range want {
			if s := st.get(w.id); s.state != w.state || s.attempts != w.attempts {
				t.Errorf("%s: %s with %d attempts, want %s with %d", w.id, s.state, s.attempts, w.state, w.attempts)
			}
		}
		if diff := cmp.Diff(map[store.State]int{store.Done: 2, store.Pending: 18}, st.states()); diff != "" {
			t.Errorf("states after drain (-want +got):\n%s", diff)
		}
		if n := tr.epCallsOf("http://a"); n != 4 {
			t.Errorf("requests = %d, want 4 (nothing claimed after cancel)", n)
		}
		if e := d.Snapshot().Endpoints[0]; len(e.Errors) != 0 || e.Breaker != "closed" {
			t.Errorf("endpoint after drain: errors %v breaker %s, want a cancellation not to count as a failure", e.Errors, e.Breaker)
		}
	})
}

func TestDrainFinishesEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 20)
		eps, _ := fleet(newTracker(), ok(5*time.Second), "http://a")
		d := mustNew(t, baseConfig(st, eps)) // DrainTimeout 30s
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAsync(ctx, d)
		time.Sleep(time.Second)
		cancel()
		start := time.Now()
		if err := wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		if took := time.Since(start); took != 4*time.Second {
			t.Errorf("drain took %v, want 4s (the in-flight requests' remaining time)", took)
		}
		if diff := cmp.Diff(map[store.State]int{store.Done: 4, store.Pending: 16}, st.states()); diff != "" {
			t.Errorf("states after drain (-want +got):\n%s", diff)
		}
	})
}

func TestLeasesExtendedAndExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 6)
		// A dead runner holds two samples with leases ending in 50 s.
		if got, _ := st.Claim(t.Context(), "short", 2, "dead-runner", 50*time.Second); len(got) != 2 {
			t.Fatalf("pre-claim got %d", len(got))
		}
		eps, _ := fleet(newTracker(), ok(5*time.Minute), "http://a") // far longer than the lease
		cfg := baseConfig(st, eps)
		cfg.Lease = 30 * time.Second
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i := range 6 {
			if s := st.get(fmt.Sprintf("s-%05d", i)); s.state != store.Done || st.finals[s.ID] != 1 {
				t.Errorf("%s: %s finished %d times, want done once", s.ID, s.state, st.finals[s.ID])
			}
		}
		if c := d.Snapshot().Counters; c.Done != 6 {
			t.Errorf("Done = %d, want 6 (no lease lost to expiry)", c.Done)
		}
	})
}

func TestStoreErrors(t *testing.T) {
	t.Run("transient error is retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 3)
			failed := 0
			st.hook = func(op, id string) error {
				if op == "complete" && failed < 2 {
					failed++
					return errors.New("database is locked")
				}
				return nil
			}
			eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
			d := mustNew(t, baseConfig(st, eps))
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := st.states(); got[store.Done] != 3 {
				t.Errorf("states = %v, want 3 done", got)
			}
		})
	})
	t.Run("lasting outage holds results and resumes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 3)
			down := errors.New("connection refused")
			var mu sync.Mutex
			outage := true
			var began time.Time // the first failed write: the outage as the dispatcher sees it
			st.hook = func(op, id string) error {
				mu.Lock()
				defer mu.Unlock()
				if outage && op == "complete" {
					if began.IsZero() {
						began = time.Now()
					}
					return down
				}
				return nil
			}
			tr := newTracker()
			eps, _ := fleet(tr, ok(time.Second), "http://a")
			d := mustNew(t, baseConfig(st, eps))
			done := make(chan error)
			go func() { done <- d.Run(t.Context()) }()
			// Ten minutes without a store: no result is dropped, no sample
			// is sent twice, and the snapshot says why nothing finishes.
			time.Sleep(10 * time.Minute)
			snap := d.Snapshot()
			if !snap.Store.Down || snap.Store.LastError != down.Error() || snap.Store.Failures < 10 {
				t.Errorf("Store during the outage = %+v, want down with %q after many retries", snap.Store, down)
			}
			if snap.Counters.Done != 0 {
				t.Errorf("Done = %d during the outage, want 0", snap.Counters.Done)
			}
			if n := tr.epCallsOf("http://a"); n != 3 {
				t.Errorf("%d requests during the outage, want 3 (held results are not re-sent)", n)
			}
			mu.Lock()
			outage = false
			lasted := time.Since(began)
			mu.Unlock()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			snap = d.Snapshot()
			// The outage ends at the first retry after the store is back,
			// so it lasts at least from the first failure to now.
			if snap.Store.Down || snap.Store.Outages != 1 || snap.Store.LastOutage < lasted {
				t.Errorf("Store after recovery = %+v, want up, one outage of >= %v", snap.Store, lasted)
			}
			for i := range 3 {
				if s := st.get(fmt.Sprintf("s-%05d", i)); s.state != store.Done || s.attempts != 1 || st.finals[s.ID] != 1 {
					t.Errorf("%s: %s, %d attempts, finished %d times; want done once with 1 attempt", s.ID, s.state, s.attempts, st.finals[s.ID])
				}
			}
		})
	})
	t.Run("interrupt during an outage ends after the drain", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 3)
			st.hook = func(op, id string) error {
				if op != "claim" {
					return errors.New("connection refused")
				}
				return nil
			}
			eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
			cfg := baseConfig(st, eps)
			cfg.DrainTimeout = 5 * time.Second
			d := mustNew(t, cfg)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error)
			go func() { done <- d.Run(ctx) }()
			time.Sleep(time.Minute)
			cancel()
			start := time.Now()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want context.Canceled", err)
			}
			// With the store down nothing can be released: the exit comes
			// at the drain timeout (fake time), not a second timeout later.
			if took := time.Since(start); took > cfg.DrainTimeout {
				t.Errorf("Run took %s after the interrupt, want the %s drain timeout at most", took, cfg.DrainTimeout)
			}
			// Nothing was recorded, so the samples are still leased to this
			// owner: a re-run or another worker returns them.
			if got := st.states(); got[store.Leased] != 3 {
				t.Errorf("states = %v, want 3 still leased", got)
			}
		})
	})
	t.Run("lease lost is dropped", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("short", "s", 3)
			st.hook = func(op, id string) error {
				if op == "complete" && id == "s-00001" {
					// Another runner took it over and finished it.
					x := st.samples[id]
					st.finish(x, store.Done)
					return store.ErrNotLeased
				}
				return nil
			}
			eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
			d := mustNew(t, baseConfig(st, eps))
			if err := d.Run(t.Context()); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if c := d.Snapshot().Counters; c.Done != 2 {
				t.Errorf("Done = %d, want 2 (the lost one is not ours)", c.Done)
			}
		})
	})
	t.Run("pending in an unknown lane", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newFakeStore()
			st.add("gone", "g", 1)
			eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
			d := mustNew(t, baseConfig(st, eps))
			if err := d.Run(t.Context()); err == nil || !strings.Contains(err.Error(), `lane "gone"`) {
				t.Errorf("Run = %v, want an error naming lane gone", err)
			}
		})
	})
}

// TestEverySampleEndsOnce runs 2,000 samples through three endpoints that
// fail at random in every way, while a supervisor pauses and resumes them,
// and checks each sample reached done or dead exactly once.
func TestEverySampleEndsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 2000
		st := newFakeStore()
		st.add("short", "s", n)
		tr := newTracker()
		var mu sync.Mutex
		rnd := rand.New(rand.NewPCG(7, 11))
		roll := func() (float64, time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			return rnd.Float64(), time.Duration(rnd.IntN(3000)) * time.Millisecond
		}
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			p, d := roll()
			switch {
			case p < 0.05:
				return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "connection reset"}
			case p < 0.15:
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Status: 503}
			case p < 0.18:
				return llm.Result{}, &llm.Error{Class: llm.Malformed, Msg: "bad chunk"}
			case p < 0.19:
				return llm.Result{}, &llm.Error{Class: llm.BadRequest, Status: 400, Msg: "context too long"}
			case p < 0.29:
				return generate(ctx, c, d, "length")
			}
			return generate(ctx, c, d, "stop")
		}, "http://a", "http://b", "http://c")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{
			{Name: "short", Concurrency: 16, MaxTokens: 100, EscalateTo: "long"},
			{Name: "long", Concurrency: 8, MaxTokens: 1000},
		}
		cfg.MaxAttempts = 4
		d := mustNew(t, cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		chaosDone := make(chan struct{})
		go func() { // a supervisor that keeps losing servers
			defer close(chaosDone)
			r := rand.New(rand.NewPCG(3, 5))
			for ctx.Err() == nil {
				time.Sleep(time.Duration(1+r.IntN(20)) * time.Second)
				u := eps[r.IntN(len(eps))].URL
				d.Pause(u, "chaos")
				time.Sleep(time.Duration(r.IntN(5)) * time.Second)
				d.Resume(u)
			}
		}()
		err := d.Run(ctx)
		cancel()
		<-chaosDone
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		states := st.states()
		if states[store.Done]+states[store.Dead] != n {
			t.Errorf("final states = %v, want all %d done or dead", states, n)
		}
		for i := range n {
			id := fmt.Sprintf("s-%05d", i)
			if got := st.finals[id]; got != 1 {
				t.Errorf("%s finished %d times, want 1", id, got)
			}
			if s := st.get(id); s.attempts > cfg.MaxAttempts {
				t.Errorf("%s: %d attempts, want <= %d", id, s.attempts, cfg.MaxAttempts)
			}
		}
		c := d.Snapshot().Counters
		if int(c.Done) != states[store.Done] || int(c.DeadLettered) != states[store.Dead] {
			t.Errorf("counters %+v disagree with states %v", c, states)
		}
		if c.Released == 0 || c.Escalated == 0 || c.Retried == 0 || c.Truncated == 0 {
			t.Errorf("counters %+v, want every path exercised", c)
		}
		if tr.peak[100] > 16 || tr.peak[1000] > 8 {
			t.Errorf("peak concurrency short=%d long=%d, want <= 16 and 8", tr.peak[100], tr.peak[1000])
		}
	})
}

// Every stored answer carries its provenance: the configuration
// generation, the model and system_fingerprint the response named, the
// server's engine and version, the sampling parameters sent (the lane's
// max_tokens among them) and the seed.
func TestStoredProvenance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		_, err := st.Ingest(t.Context(), []store.NewSample{
			{ID: "seeded", Partition: "p", Lane: "short", Body: []byte(`{"messages":[{"role":"user","content":"seeded"}],"seed":42}`)},
			{ID: "plain", Partition: "p", Lane: "short", Body: []byte(`{"messages":[{"role":"user","content":"plain"}]}`)},
		})
		if err != nil {
			t.Fatal(err)
		}
		eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
			return llm.Result{Content: "hi", FinishReason: "stop", Model: "served-m", SystemFingerprint: "fp_1",
				Usage: llm.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2}}, nil
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Generation = 2
		cfg.Params = map[string]json.RawMessage{"temperature": json.RawMessage(`0.7`), "top_p": json.RawMessage(`0.9`)}
		d := mustNew(t, cfg)
		d.SetServer("http://a", Server{Engine: "sglang", Version: "0.5.6"})
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		seed := int64(42)
		for id, wantSeed := range map[string]*int64{"seeded": &seed, "plain": nil} {
			r := st.get(id).result
			var rec struct {
				Provenance store.Provenance `json:"provenance"`
			}
			if err := json.Unmarshal(r.Response, &rec); err != nil {
				t.Fatalf("%s: stored response is not JSON: %v", id, err)
			}
			want := store.Provenance{Generation: 2, Model: "served-m", SystemFingerprint: "fp_1", Engine: "sglang", EngineVersion: "0.5.6",
				Sampling: json.RawMessage(`{"max_tokens":100,"temperature":0.7,"top_p":0.9}`), Seed: wantSeed}
			if diff := cmp.Diff(want, rec.Provenance); diff != "" {
				t.Errorf("%s: provenance (-want +got):\n%s", id, diff)
			}
			if r.Generation != 2 {
				t.Errorf("%s: stored generation %d, want 2", id, r.Generation)
			}
		}
	})
}
