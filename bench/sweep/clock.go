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

	mu  sync.Mutex
	per []clockState
}

type clockState struct {
	ok          bool
	clock       float64
	retracted   float64
	at          time.Time
	elapsed     float64
	retractions float64
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
			clock, retracted, ok := c.scrape(ctx, u)
			c.observe(i, clock, retracted, ok, time.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *clockWatch) observe(i int, clock, retracted float64, ok bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.per[i]
	switch {
	case !s.started:
		// The job's clock starts at the first answer: loading is not the job's time.
		if ok {
			s.started = true
			s.ok, s.clock, s.retracted, s.at = true, clock, retracted, now
		}
		return
	case ok && s.ok && clock >= s.clock:
		s.elapsed += clock - s.clock
		if retracted >= s.retracted {
			s.retractions += retracted - s.retracted
		}
	case ok:
		// A new incarnation: its own clock and counter started at zero.
		s.elapsed += now.Sub(s.at).Seconds()*c.speed + clock
		s.retractions += retracted
	default:
		s.elapsed += now.Sub(s.at).Seconds() * c.speed
	}
	s.ok, s.at = ok, now
	if ok {
		s.clock, s.retracted = clock, retracted
	}
}

func (c *clockWatch) scrape(ctx context.Context, url string) (clock, retracted float64, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, 0, false
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, false
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, false
	}
	f, found := fams[sim.ClockMetric]
	if !found || len(f.GetMetric()) == 0 {
		return 0, 0, false
	}
	clock = f.GetMetric()[0].GetGauge().GetValue()
	for _, name := range []string{"sglang:num_retracted_requests_total", "sglang:num_retracted_requests", "vllm:num_preemptions_total", "vllm:num_preemptions"} {
		if g, found := fams[name]; found && len(g.GetMetric()) > 0 {
			retracted = g.GetMetric()[0].GetCounter().GetValue()
			break
		}
	}
	return clock, retracted, true
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
