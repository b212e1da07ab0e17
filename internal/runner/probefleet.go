package runner

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/probe"
)

// probeFleet watches endpoints regen did not launch: it can only probe them
// and report, never restart. An endpoint is READY after a healthy probe and
// DOWN after probeFailures failed ones in a row; a hang is token silence with
// requests in flight for the hang deadline.
type probeFleet struct {
	*statusBoard
	mu      sync.Mutex
	engines map[string]engine.Dialect
	// detect lists the endpoints whose job names no engine: the first
	// healthy probe asks the server (probe.Detect) before it is READY.
	detect map[string]bool
	// onDetect hears what detection found (set before Run).
	onDetect func(url, evidence string)
	every    time.Duration
	hang     time.Duration
	client   *http.Client
}

const probeFailures = 3

func newProbeFleet(spec *job.Spec, onState stateFunc) *probeFleet {
	urls := make([]string, 0, len(spec.Endpoints))
	engines := map[string]engine.Dialect{}
	detect := map[string]bool{}
	for _, e := range spec.Endpoints {
		urls = append(urls, e.URL)
		d, err := engine.Lookup(e.Engine)
		if err != nil {
			d, _ = engine.Lookup("sglang")
		}
		engines[e.URL] = d
		detect[e.URL] = e.Detect
	}
	hang := spec.Monitor.HangAfter
	if hang <= 0 {
		hang = job.DefaultHangAfter
	}
	every := probeEvery(spec)
	return &probeFleet{statusBoard: newStatusBoard(urls, onState), engines: engines, detect: detect, every: min(every, hang/3),
		hang: hang, client: &http.Client{}}
}

func (f *probeFleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, url := range f.URLs() {
		wg.Go(func() { f.watch(ctx, url) })
		wg.Go(func() {
			f.scrapeLoop(ctx, f.client, url, func() engine.Dialect { d, _ := f.Engine(url); return d }, f.every)
		})
	}
	wg.Wait()
	return nil
}

// Engine is the dialect of url's server and whether it is settled (named
// by the job, or detected from what the server says).
func (f *probeFleet) Engine(url string) (engine.Dialect, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.engines[url], !f.detect[url]
}

// detectEngine asks the server at url what it is, once, while it is
// healthy; a server that names no engine keeps the default (sglang).
func (f *probeFleet) detectEngine(ctx context.Context, url string) {
	if _, settled := f.Engine(url); settled {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, modelCheckTimeout)
	name, evidence, err := probe.Detect(dctx, f.client, url)
	cancel()
	if ctx.Err() != nil {
		return
	}
	d, lerr := engine.Lookup(name)
	f.mu.Lock()
	f.detect[url] = false
	msg := fmt.Sprintf("engine %s detected (%s)", name, evidence)
	if err != nil || lerr != nil {
		msg = fmt.Sprintf("engine not named by the server (%v); taken for %s", cmpErr(err, lerr), f.engines[url].Name)
	} else {
		f.engines[url] = d
	}
	report := f.onDetect
	f.mu.Unlock()
	if report != nil {
		report(url, msg)
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (f *probeFleet) watch(ctx context.Context, url string) {
	fails := 0
	// A wedged server whose /health still answers 200 would otherwise flap
	// STALLED -> READY every probe: after each stall it stays STALLED for a
	// cooldown that doubles while stalls repeat, and tokens after a retry
	// reset it.
	stalls := 0
	var stalledUntil time.Time
	var tokensAtRetry int64
	for {
		d, _ := f.Engine(url)
		snap := probe.Probe(ctx, f.client, url, d)
		if snap.Healthy() {
			f.detectEngine(ctx, url)
		}
		if ctx.Err() != nil {
			return
		}
		inFlight, last := f.progressOf(url)
		switch {
		case !snap.Healthy():
			fails++
			if fails >= probeFailures || f.get(url).State == monitor.Starting {
				f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Down, Cause: healthCause(snap),
					Evidence: []string{fmt.Sprintf("%d failed health probes in a row", fails)}})
			}
		case f.hang > 0 && inFlight > 0 && !last.IsZero() && time.Since(last) > f.hang:
			fails = 0
			stalls++
			cooldown := min(f.hang<<(stalls-1), 10*time.Minute)
			stalledUntil = time.Now().Add(cooldown)
			// The cause stays the same while the hang lasts, so it is one event, not one per probe.
			f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Stalled, Cause: "hang",
				Evidence: []string{fmt.Sprintf("no token for %s with %d requests in flight (deadline %s); next try in %s",
					time.Since(last).Round(time.Second), inFlight, f.hang, cooldown)}})
		case time.Now().Before(stalledUntil):
			fails = 0 // healthy by its probe, but it just hung: wait out the cooldown
		default:
			fails = 0
			if !stalledUntil.IsZero() {
				stalledUntil, tokensAtRetry = time.Time{}, f.tokensOf(url)
			}
			if stalls > 0 && f.tokensOf(url) > tokensAtRetry {
				stalls = 0 // tokens flowed after the retry: it recovered
			}
			f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Ready})
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(f.every):
		}
	}
}

func healthCause(s probe.Snapshot) string {
	if s.HealthErr != nil {
		return "health probe: " + s.HealthErr.Error()
	}
	return fmt.Sprintf("health probe: HTTP %d", s.HealthStatus)
}
