package fleet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/probe"
)

type stateFunc func(ctx context.Context, prev, cur monitor.EndpointStatus)

// statusBoard holds endpoint statuses and reports changes through onState.
type statusBoard struct {
	mu       sync.Mutex
	statuses map[string]monitor.EndpointStatus
	// reported holds the URLs whose state was reported at least once: the
	// placeholder STARTING of newStatusBoard must not swallow the fleet's
	// first real STARTING, which carries the pid and argv.
	reported map[string]bool
	order    []string
	onState  stateFunc
	progress func(url string) (int, time.Time)
	tokens   func(url string) int64
	observer func(url string, snap probe.Snapshot)
}

func newStatusBoard(urls []string, onState stateFunc) *statusBoard {
	b := &statusBoard{statuses: map[string]monitor.EndpointStatus{}, reported: map[string]bool{}, order: urls, onState: onState}
	for _, u := range urls {
		b.statuses[u] = monitor.EndpointStatus{URL: u, State: monitor.Starting, Since: time.Now()}
	}
	return b
}

func (b *statusBoard) set(ctx context.Context, cur monitor.EndpointStatus) {
	b.mu.Lock()
	prev := b.statuses[cur.URL]
	if b.reported[cur.URL] && prev.State == cur.State && prev.Cause == cur.Cause {
		b.mu.Unlock()
		return
	}
	if cur.Since.IsZero() {
		cur.Since = time.Now()
	}
	b.statuses[cur.URL] = cur
	b.reported[cur.URL] = true
	b.mu.Unlock()
	if b.onState != nil {
		b.onState(ctx, prev, cur)
	}
}

func (b *statusBoard) get(url string) monitor.EndpointStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statuses[url]
}

func (b *statusBoard) Statuses() []monitor.EndpointStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]monitor.EndpointStatus, 0, len(b.order))
	for _, u := range b.order {
		out = append(out, b.statuses[u])
	}
	return out
}

func (b *statusBoard) URLs() []string { return b.order }

func (b *statusBoard) board() *statusBoard { return b }

func (b *statusBoard) SetProgress(f func(string) (int, time.Time)) {
	b.mu.Lock()
	b.progress = f
	b.mu.Unlock()
}

func (b *statusBoard) SetTokens(f func(string) int64) {
	b.mu.Lock()
	b.tokens = f
	b.mu.Unlock()
}

func (b *statusBoard) SetObserver(f func(string, probe.Snapshot)) {
	b.mu.Lock()
	b.observer = f
	b.mu.Unlock()
}

// scrapeLoop reads the metrics of the server at url every period until ctx
// ends and hands each good read to the observer. It runs apart from the
// health probes: SGLang's /health (and the simulator's) runs a one-token
// generation that waits in the server's queue, a second or more under load,
// and the adaptive limits need the load exactly then.
// dialect is asked every period: an endpoint's engine may be detected
// after the loop starts.
func (b *statusBoard) scrapeLoop(ctx context.Context, client *http.Client, url string, dialect func() engine.Dialect, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		at := time.Now()
		d := dialect()
		if d.MetricsPath == "" {
			return
		}
		m, err := probe.Metrics(ctx, client, url, d)
		if ctx.Err() != nil {
			return
		}
		b.observe(probe.Snapshot{URL: url, Time: at, Metrics: m, MetricsErr: err})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observe passes a probe with metrics to the observer.
func (b *statusBoard) observe(snap probe.Snapshot) {
	b.mu.Lock()
	f := b.observer
	b.mu.Unlock()
	if f != nil && snap.MetricsErr == nil {
		f(snap.URL, snap)
	}
}

func (b *statusBoard) tokensOf(url string) int64 {
	b.mu.Lock()
	f := b.tokens
	b.mu.Unlock()
	if f == nil {
		return 0
	}
	return f(url)
}

func (b *statusBoard) progressOf(url string) (int, time.Time) {
	b.mu.Lock()
	f := b.progress
	b.mu.Unlock()
	if f == nil {
		return 0, time.Time{}
	}
	return f(url)
}

// freeLoopbackAddr picks a free port on 127.0.0.1 for a server we start, so its
// URL is known before it binds and stays the same across restarts.
func freeLoopbackAddr(host string, port int) (string, error) {
	if host == "" {
		host = "127.0.0.1"
	}
	if port != 0 {
		return net.JoinHostPort(host, strconv.Itoa(port)), nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func openLog(logDir, name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(logDir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open server log: %w", err)
	}
	return f, nil
}
