package runner

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/probe"
)

// loadEvery is how often the endpoints' own metrics (KV usage, queue) are
// scraped for the views and the history.
const loadEvery = 5 * time.Second

// loadWatch keeps each endpoint's last metrics scrape for the heartbeat,
// so `regen watch` and the dashboard show KV usage and queues.
type loadWatch struct {
	engines map[string]engine.Dialect
	client  *http.Client

	mu   sync.Mutex
	last map[string]monitor.EndpointLoad
}

func newLoadWatch(spec *job.Spec, urls []string) *loadWatch {
	w := &loadWatch{engines: map[string]engine.Dialect{}, client: &http.Client{}, last: map[string]monitor.EndpointLoad{}}
	for _, url := range urls {
		name := ""
		if spec.Server != nil {
			name = spec.Server.Engine
		}
		for _, e := range spec.Endpoints {
			if e.URL == url && e.Engine != "" {
				name = e.Engine
			}
		}
		if d, err := engine.Lookup(name); err == nil && d.MetricsPath != "" {
			w.engines[url] = d
		}
	}
	return w
}

// run scrapes every endpoint each loadEvery until ctx ends. A failed
// scrape forgets the endpoint's last reading: an old KV usage shown as
// current would mislead.
func (w *loadWatch) run(ctx context.Context) {
	defer w.client.CloseIdleConnections()
	tickUntil(ctx, loadEvery, func() {
		var wg sync.WaitGroup
		for url, d := range w.engines {
			wg.Go(func() {
				m, err := probe.Metrics(ctx, w.client, url, d)
				w.mu.Lock()
				defer w.mu.Unlock()
				if err != nil {
					delete(w.last, url)
					return
				}
				w.last[url] = loadOf(m, time.Now())
			})
		}
		wg.Wait()
	})
}

func loadOf(m engine.Metrics, t time.Time) monitor.EndpointLoad {
	l := monitor.EndpointLoad{Time: t, KVUsage: -1, Queued: -1, Running: -1}
	if m.Present.Has(engine.FieldTokenUsage) {
		l.KVUsage = m.TokenUsage
	}
	if m.Present.Has(engine.FieldQueued) {
		l.Queued = m.Queued
	}
	if m.Present.Has(engine.FieldRunning) {
		l.Running = m.Running
	}
	return l
}

// of returns the last reading for url, nil when there is none.
func (w *loadWatch) of(url string) *monitor.EndpointLoad {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	l, ok := w.last[url]
	if !ok {
		return nil
	}
	return &l
}
