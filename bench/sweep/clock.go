package main

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/regen-dev/regen/internal/sim"
)

// clockWatch follows the simulated clock and retraction counter of each
// server through restarts. Between two scrapes of the same incarnation the
// job advanced by the clock's difference; across a restart (the clock went
// back) or while the server did not answer, by the real time passed times
// the speed, which is what a down server costs in simulated time.
type clockWatch struct {
	urls  []string
	speed float64
	hc    *http.Client

	mu     sync.Mutex
	per    []clockState
	series [][2]float64
}

type clockState struct {
	ok          bool
	clock       float64
	retracted   float64
	generated   float64
	at          time.Time
	elapsed     float64
	retractions float64
	tokens      float64 // generated so far, through restarts
	restarts    int
	started     bool
}

func newClockWatch(urls []string, speed float64) *clockWatch {
	return &clockWatch{urls: urls, speed: speed, hc: &http.Client{Timeout: 2 * time.Second}, per: make([]clockState, len(urls))}
}

func (c *clockWatch) run(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	defer c.hc.CloseIdleConnections()
	for {
		for i, u := range c.urls {
			clock, retracted, generated, ok := c.scrape(ctx, u)
			c.observe(i, clock, retracted, generated, ok, time.Now())
		}
		c.record()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *clockWatch) observe(i int, clock, retracted, generated float64, ok bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.per[i]
	switch {
	case !s.started:
		// The job's clock starts at the first answer: loading is not the job's time.
		if ok {
			s.started = true
			s.ok, s.clock, s.retracted, s.generated, s.at = true, clock, retracted, generated, now
		}
		return
	case ok && s.ok && clock >= s.clock:
		s.elapsed += clock - s.clock
		if retracted >= s.retracted {
			s.retractions += retracted - s.retracted
		}
		if generated >= s.generated {
			s.tokens += generated - s.generated
		}
	case ok:
		// A new incarnation: its own clock and counters started at zero.
		s.restarts++
		s.elapsed += now.Sub(s.at).Seconds()*c.speed + clock
		s.retractions += retracted
		s.tokens += generated
	default:
		s.elapsed += now.Sub(s.at).Seconds() * c.speed
	}
	s.ok, s.at = ok, now
	if ok {
		s.clock, s.retracted, s.generated = clock, retracted, generated
	}
}

// record keeps (simulated time, tokens generated) of the whole fleet.
func (c *clockWatch) record() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t, n float64
	for _, s := range c.per {
		t = max(t, s.elapsed)
		n += s.tokens
	}
	c.series = append(c.series, [2]float64{t, n})
}

// timeTo is the simulated time at which the fleet had generated share of
// its final token count: the job without its tail of last long requests.
func (c *clockWatch) timeTo(share float64) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.series) == 0 {
		return 0
	}
	final := c.series[len(c.series)-1][1]
	for _, p := range c.series {
		if p[1] >= share*final {
			return p[0]
		}
	}
	return c.series[len(c.series)-1][0]
}

func (c *clockWatch) scrape(ctx context.Context, url string) (clock, retracted, generated float64, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, 0, 0, false
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, 0, 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, 0, false
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, 0, false
	}
	f, found := fams[sim.ClockMetric]
	if !found || len(f.GetMetric()) == 0 {
		return 0, 0, 0, false
	}
	clock = f.GetMetric()[0].GetGauge().GetValue()
	for _, name := range []string{"sglang:num_retracted_requests_total", "sglang:num_retracted_requests", "vllm:num_preemptions_total", "vllm:num_preemptions"} {
		if g, found := fams[name]; found && len(g.GetMetric()) > 0 {
			retracted = g.GetMetric()[0].GetCounter().GetValue()
			break
		}
	}
	for _, name := range []string{"sglang:generation_tokens_total", "sglang:generation_tokens", "vllm:generation_tokens_total", "vllm:generation_tokens"} {
		if g, found := fams[name]; found && len(g.GetMetric()) > 0 {
			generated = g.GetMetric()[0].GetCounter().GetValue()
			break
		}
	}
	return clock, retracted, generated, true
}

// simSeconds is the longest simulated duration among the servers.
func (c *clockWatch) simSeconds() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := 0.0
	for _, s := range c.per {
		m = max(m, s.elapsed)
	}
	return m
}

func (c *clockWatch) retractions() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0.0
	for _, s := range c.per {
		n += s.retractions
	}
	return n
}

// restarts counts the new server incarnations seen, over all servers.
func (c *clockWatch) restarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.per {
		n += s.restarts
	}
	return n
}
