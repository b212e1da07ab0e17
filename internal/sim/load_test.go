package sim

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadResult is what a closed-loop load run measured.
type loadResult struct {
	tokens    int64
	simTime   time.Duration
	retracted float64
	failures  int64
}

func (r loadResult) goodput() float64 { return float64(r.tokens) / r.simTime.Seconds() }

// runLoad drives conc streaming clients in a closed loop until n requests
// completed and measures goodput in simulated time.
func runLoad(t *testing.T, cfg Config, conc, n int) loadResult {
	t.Helper()
	s, url, logs := startServer(t, cfg)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	defer client.CloseIdleConnections()
	var next, tokens, failures atomic.Int64
	start := s.sched.simClock.Load()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				body := chatBody(fmt.Sprintf("question %d: explain the thing in detail", i), 1024, "")
				r := streamChat(client, url, body)
				if r.err != nil || !r.done || r.usage == nil {
					failures.Add(1)
					continue
				}
				tokens.Add(int64(r.usage.CompletionTokens))
			}
		})
	}
	wg.Wait()
	end := s.sched.simClock.Load()
	res := loadResult{tokens: tokens.Load(), simTime: time.Duration(end - start), failures: failures.Load()}
	res.retracted = scrape(t, url)["sglang:num_retracted_requests_total"]
	if res.failures > 0 {
		t.Errorf("concurrency %d: %d failed requests; logs:\n%s", conc, res.failures, logs)
	}
	return res
}

// curveConfig is a small server whose batching saturates early, so
// retraction waste shows in goodput.
func curveConfig() Config {
	c := testConfig()
	c.Speed = 20
	c.KVTokens = 3000
	c.OutputMean = 400
	c.OutputSigma = 0.3
	c.TruncateFraction = 0
	c.DecodeBase = 500 * time.Microsecond
	c.DecodePerReq = time.Millisecond
	c.DecodePerKToken = 100 * time.Microsecond
	c.NewTokenRatioDecaySteps = 5
	return c
}

func TestThroughputCurvePeaksThenFalls(t *testing.T) {
	if testing.Short() {
		t.Skip("load curve in -short mode")
	}
	levels := []int{1, 4, 8, 16, 32}
	var res []loadResult
	peak := 0
	for i, c := range levels {
		r := runLoad(t, curveConfig(), c, max(16, 3*c))
		t.Logf("concurrency %3d: goodput %6.1f tok/s (simulated), %d tokens in %v, retracted %v", c, r.goodput(), r.tokens, r.simTime, r.retracted)
		res = append(res, r)
		if r.goodput() > res[peak].goodput() {
			peak = i
		}
	}
	last := res[len(res)-1]
	if peak == len(levels)-1 {
		t.Errorf("goodput peaks at the highest concurrency %d; want a peak before it", levels[peak])
	}
	if got, want := last.goodput(), 0.95*res[peak].goodput(); got >= want {
		t.Errorf("goodput at concurrency %d = %.1f; want < %.1f (95%% of the peak)", levels[len(levels)-1], got, want)
	}
	if last.retracted == 0 {
		t.Errorf("no retractions at concurrency %d; want over-admission to retract", levels[len(levels)-1])
	}
	for i := 0; i <= peak; i++ {
		if res[i].retracted != 0 {
			t.Errorf("concurrency %d (at or below the peak) retracted %v requests; want 0", levels[i], res[i].retracted)
		}
	}
}
