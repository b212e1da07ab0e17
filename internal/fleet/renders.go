package fleet

import (
	"context"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/probe"
)

// The render probe of an endpoint that did not give a verdict (503 while
// the model loads, 401, no answer) is asked again after renderRetryMin,
// doubling to renderRetryMax, and at the endpoint's next identification.
const (
	renderRetryMin  = 5 * time.Second
	renderRetryMax  = 5 * time.Minute
	renderRetryTick = time.Second
)

// renderProbe is what the fleet knows of one endpoint's chat render route.
type renderProbe struct {
	known bool   // the server gave a verdict: the route, or none
	path  string // the route, when known and offered
	// After a probe without a verdict: its dialect, when to ask again and
	// how long to wait after the next failure.
	dialect engine.Dialect
	next    time.Time
	wait    time.Duration
}

// renderRoute is the chat render route the dispatcher checks each turn's
// prompt ids with (dispatch.Server.Render): the dialect's, when the job
// exports token ids and the server answers it. A verdict (the route, or
// none: probe.Render) is kept for the run; a probe without one leaves the
// route unknown, asked again with backoff (retryRenders) and at the next
// identification.
func (f *Fleet) renderRoute(ctx context.Context, url string, d engine.Dialect) string {
	if !f.cfg.Spec.Output.TokenIDs || d.RenderPath == "" {
		return ""
	}
	f.mu.Lock()
	p := f.render[url]
	f.mu.Unlock()
	if p != nil && p.known {
		return p.path
	}
	return f.probeRender(ctx, url, d, time.Now())
}

// probeRender asks url for its render route and records the answer: the
// verdict, or when to ask again.
func (f *Fleet) probeRender(ctx context.Context, url string, d engine.Dialect, now time.Time) string {
	_, key := f.Engine(url)
	ok, err := probe.Render(ctx, nil, url, d, key)
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.render[url]
	if p == nil {
		p = &renderProbe{}
		f.render[url] = p
	}
	if err != nil {
		p.dialect = d
		p.wait = min(max(2*p.wait, renderRetryMin), renderRetryMax)
		p.next = now.Add(p.wait)
		f.log.Info("render route unknown; asked again later", "endpoint", url, "err", err, "retry_in", p.wait)
		return ""
	}
	p.known = true
	if ok {
		p.path = d.RenderPath
		f.log.Info("render route: each turn's prompt ids are checked against it", "endpoint", url, "path", p.path)
	}
	return p.path
}

// reprobeRenders asks again, until ctx ends, the render routes whose probe
// gave no verdict (Run owns it).
func (f *Fleet) reprobeRenders(ctx context.Context) {
	onTicks(ctx, renderRetryTick, func(now time.Time) bool {
		f.retryRenders(ctx, now)
		return true
	})
}

// retryRenders probes the render routes due at now; a route found is given
// to the dispatcher with the rest of the endpoint's server kept.
func (f *Fleet) retryRenders(ctx context.Context, now time.Time) {
	if f.disp == nil {
		return
	}
	type due struct {
		url string
		d   engine.Dialect
	}
	var todo []due
	f.mu.Lock()
	for url, p := range f.render {
		if !p.known && !now.Before(p.next) {
			todo = append(todo, due{url, p.dialect})
		}
	}
	f.mu.Unlock()
	for _, u := range todo {
		pctx, cancel := context.WithTimeout(ctx, modelCheckTimeout)
		path := f.probeRender(pctx, u.url, u.d, now)
		cancel()
		if path != "" {
			f.setServer(u.url, func(s *dispatch.Server) { s.Render = path })
		}
	}
}

// setServer gives the dispatcher the server at url, as identify last found
// it and changed by edit.
func (f *Fleet) setServer(url string, edit func(*dispatch.Server)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.servers[url]
	edit(&s)
	f.servers[url] = s
	f.disp.SetServer(url, s)
}
