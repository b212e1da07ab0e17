package main

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/regen-dev/regen/bench/internal/bound"
	"github.com/regen-dev/regen/internal/sim"
)

// clockWatch follows the simulated clock and retraction counter of each
// server through restarts. Between two scrapes of the same incarnation the
// job advanced by the clock's difference; across a restart (the clock went
// back) or while the server did not answer, by the real time passed times
// the speed, which is what a down server costs in simulated time. The
// simulator's clock reads the present also while it idles, so a server
// that waited for the others to start does not count its wait.
type clockWatch struct {
	urls  []string
	speed float64
	hc    *http.Client

	mu     sync.Mutex
	per    []clockState
	series [][2]float64
	loads  []bound.Sample // the fleet's queues and KV at each scrape after the start
	// The real time of the first and the last scrape after the start: the
	// span the simulated time was counted over.
	first, last time.Time
}

type clockState struct {
	ok       bool
	clock    float64
	last     counters // the current incarnation's counters at the last scrape
	at       time.Time
	elapsed  float64
	total    counters // through restarts
	restarts int
	started  bool
	downFor  float64      // simulated time counted for failed scrapes since the last good one
	now      bound.Gauges // the last good scrape's gauges
}

// counters are the server counters the sweep follows through restarts.
type counters struct {
	retracted, generated, prompt, cached float64
}

func (c counters) plus(d counters) counters {
	return counters{c.retracted + d.retracted, c.generated + d.generated, c.prompt + d.prompt, c.cached + d.cached}
}

// since is what c added after an earlier scrape of the same incarnation
// (a counter that went back adds nothing).
func (c counters) since(old counters) counters {
	pos := func(a, b float64) float64 { return max(a-b, 0) }
	return counters{pos(c.retracted, old.retracted), pos(c.generated, old.generated), pos(c.prompt, old.prompt), pos(c.cached, old.cached)}
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
			clock, cs, g, ok := c.scrape(ctx, u)
			c.observe(i, clock, cs, ok, time.Now())
			c.gauge(i, g, ok)
		}
		c.record(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *clockWatch) observe(i int, clock float64, cs counters, ok bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.per[i]
	switch {
	case !s.started:
		// The job's clock starts at the first answer: loading is not the job's time.
		if ok {
			s.started = true
			s.ok, s.clock, s.last, s.at = true, clock, cs, now
		}
		return
	case ok && clock >= s.clock:
		// The same incarnation, also after scrapes that failed (a busy
		// machine can time one out): its clock says how much time passed,
		// of which the failed scrapes already counted downFor.
		s.elapsed += max(clock-s.clock-s.downFor, 0)
		s.total = s.total.plus(cs.since(s.last))
		s.downFor = 0
	case ok:
		// A new incarnation: its counters started at zero, and its clock
		// (its loading, the simulator's clock reads the present) ran within
		// the real time since the last scrape, which is what is counted.
		s.restarts++
		s.elapsed += now.Sub(s.at).Seconds() * c.speed
		s.total = s.total.plus(cs)
		s.downFor = 0
	default:
		d := now.Sub(s.at).Seconds() * c.speed
		s.elapsed += d
		s.downFor += d
	}
	s.ok, s.at = ok, now
	if ok {
		s.clock, s.last = clock, cs
	}
}

// gauge keeps server i's load from its last scrape (a failed one reads as
// an idle server: a down server is not busy).
func (c *clockWatch) gauge(i int, g bound.Gauges, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		g = bound.Gauges{}
	}
	c.per[i].now = g
}

// record keeps (simulated time, tokens generated) of the whole fleet, and
// its load once a server has started.
func (c *clockWatch) record(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t, n float64
	started := false
	for _, s := range c.per {
		t = max(t, s.elapsed)
		n += s.total.generated
		started = started || s.started
	}
	c.series = append(c.series, [2]float64{t, n})
	if started {
		var load []bound.Gauges
		for _, s := range c.per {
			load = append(load, s.now)
		}
		c.loads = append(c.loads, bound.NewSample(t, load))
		if c.first.IsZero() {
			c.first = now
		}
		c.last = now
	}
}

// realSpan is the real time from the first scrape after the start to the
// last: the wall time the simulated seconds were counted in.
func (c *clockWatch) realSpan() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Sub(c.first)
}

// bulkLoad is the fleet's mean load over the scrapes up to simulated time
// until (the job's bulk, before its tail).
func (c *clockWatch) bulkLoad(until float64) bound.Load {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bound.MeanLoad(c.loads, until)
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

func (c *clockWatch) scrape(ctx context.Context, url string) (clock float64, cs counters, g bound.Gauges, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, cs, g, false
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, cs, g, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, cs, g, false
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, cs, g, false
	}
	f, found := fams[sim.ClockMetric]
	if !found || len(f.GetMetric()) == 0 {
		return 0, cs, g, false
	}
	clock = f.GetMetric()[0].GetGauge().GetValue()
	counter := func(names ...string) float64 {
		for _, name := range names {
			if g, found := fams[name]; found && len(g.GetMetric()) > 0 {
				return g.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	cs.retracted = counter("sglang:num_retracted_requests_total", "sglang:num_retracted_requests", "vllm:num_preemptions_total", "vllm:num_preemptions")
	cs.generated = counter("sglang:generation_tokens_total", "sglang:generation_tokens", "vllm:generation_tokens_total", "vllm:generation_tokens")
	// The prefix cache: prompt tokens asked for and those found cached.
	cs.prompt = counter("sglang:prompt_tokens_total", "sglang:prompt_tokens", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
	cs.cached = counter("sglang:cached_tokens_total", "sglang:cached_tokens", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
	g = bound.ReadGauges(fams)
	return clock, cs, g, true
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

// totals are the fleet's counters through restarts.
func (c *clockWatch) totals() counters {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t counters
	for _, s := range c.per {
		t = t.plus(s.total)
	}
	return t
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
