package bound

import (
	"context"
	"math"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/regen-dev/regen/internal/sim"
)

// The gauges' names per engine dialect, first found wins.
var (
	queueNames   = []string{"sglang:num_queue_reqs", "vllm:num_requests_waiting", "llamacpp:requests_deferred"}
	usageNames   = []string{"sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"}
	runningNames = []string{"sglang:num_running_reqs", "vllm:num_requests_running", "llamacpp:requests_processing"}
)

// ReadGauges is a server's load from its parsed /metrics (0 for a gauge
// the server does not expose).
func ReadGauges(fams map[string]*dto.MetricFamily) Gauges {
	gauge := func(names []string) float64 {
		for _, name := range names {
			if g, found := fams[name]; found && len(g.GetMetric()) > 0 {
				return g.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return 0
	}
	return Gauges{Queue: gauge(queueNames), Usage: gauge(usageNames), Running: gauge(runningNames)}
}

// WatchConfig says what a Watch reads.
type WatchConfig struct {
	URLs  []string // servers whose /metrics it scrapes; none for a plain server
	Speed float64  // the speed asked of the simulators (or of Clock); 0: not compared
	Slots int      // request slots per server when slot-bound (llama-server --parallel); 0: none
	// Clock is the simulated seconds so far of a paced server without
	// metrics (a ticker's ticks times its step, at Speed 1).
	Clock func() float64
}

// Watch measures one side of a comparison while it runs: the servers'
// gauges every 50 ms, the process's CPU and the simulators' (or Clock's)
// speed, from StartWatch to Stop.
type Watch struct {
	cfg    WatchConfig
	hc     *http.Client
	t0     time.Time
	cpu0   time.Duration
	clock0 float64
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	samples  []Sample
	clocks   []clockSpan // per server
	answered []bool      // per server: it answered at least once
}

// clockSpan is a simulator's clock at its first and its last answer.
type clockSpan struct {
	ok          bool
	first, last float64
	at0, at1    time.Time
}

// StartWatch takes a first sample before it returns, then one every 50 ms.
func StartWatch(ctx context.Context, cfg WatchConfig) *Watch {
	ctx, cancel := context.WithCancel(ctx)
	w := &Watch{cfg: cfg, hc: &http.Client{Timeout: 2 * time.Second}, cancel: cancel, done: make(chan struct{}), clocks: make([]clockSpan, len(cfg.URLs)), answered: make([]bool, len(cfg.URLs))}
	w.t0, w.cpu0 = time.Now(), CPUTime()
	if cfg.Clock != nil {
		w.clock0 = cfg.Clock()
	}
	w.sample(ctx, true)
	go func() {
		defer close(w.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				w.sample(ctx, true)
			}
		}
	}()
	return w
}

// Stop takes a last sample and classifies the stretch since StartWatch.
func (w *Watch) Stop() Cell {
	wall, cpu := time.Since(w.t0), CPUTime()-w.cpu0
	w.cancel()
	<-w.done
	w.sample(context.Background(), false) // the clocks' last reading; the run has ended, its load is not the run's
	w.hc.CloseIdleConnections()
	w.mu.Lock()
	defer w.mu.Unlock()
	var l Load
	if len(w.cfg.URLs) > 0 {
		l = MeanLoad(w.samples, math.Inf(1))
	}
	simSeconds, span, paced := w.simTime(wall)
	speed := w.cfg.Speed
	if !paced {
		speed = 0
	}
	servers := 0
	for _, a := range w.answered {
		if a {
			servers++
		}
	}
	return NewCell(l, MeasureUsage(cpu, wall, simSeconds, span, speed), servers, paced && speed > 0)
}

// simTime is the simulated seconds counted and the real span they were
// counted in: the longest simulator clock between its first and last
// answer, else Clock over the whole watch.
func (w *Watch) simTime(wall time.Duration) (float64, time.Duration, bool) {
	if w.cfg.Clock != nil {
		return w.cfg.Clock() - w.clock0, wall, true
	}
	var sim float64
	var first, last time.Time
	paced := false
	for _, c := range w.clocks {
		if !c.ok {
			continue
		}
		paced = true
		sim = max(sim, c.last-c.first)
		if first.IsZero() || c.at0.Before(first) {
			first = c.at0
		}
		if c.at1.After(last) {
			last = c.at1
		}
	}
	return sim, last.Sub(first), paced
}

func (w *Watch) sample(ctx context.Context, load bool) {
	now := make([]Gauges, len(w.cfg.URLs))
	clocks := make([]float64, len(w.cfg.URLs))
	oks := make([]bool, len(w.cfg.URLs))
	for i, u := range w.cfg.URLs {
		now[i], clocks[i], oks[i] = w.scrape(ctx, u)
	}
	at := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, ok := range oks {
		w.answered[i] = w.answered[i] || ok
		c := &w.clocks[i]
		switch {
		case !ok || clocks[i] < 0:
		case !c.ok:
			*c = clockSpan{ok: true, first: clocks[i], last: clocks[i], at0: at, at1: at}
		case clocks[i] >= c.last:
			c.last, c.at1 = clocks[i], at
		}
	}
	if load && len(w.cfg.URLs) > 0 {
		w.samples = append(w.samples, NewSample(at.Sub(w.t0).Seconds(), now))
	}
}

// scrape reads a server's gauges and simulated clock (-1 when it has
// none); a server that does not answer reads as idle.
func (w *Watch) scrape(ctx context.Context, url string) (Gauges, float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return Gauges{}, -1, false
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return Gauges{}, -1, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Gauges{}, -1, false
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return Gauges{}, -1, false
	}
	g := ReadGauges(fams)
	g.Slots = float64(w.cfg.Slots)
	clock := -1.0
	if f, found := fams[sim.ClockMetric]; found && len(f.GetMetric()) > 0 {
		clock = f.GetMetric()[0].GetGauge().GetValue()
	}
	return g, clock, true
}
