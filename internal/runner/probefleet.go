package runner

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
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
	engines map[string]engine.Dialect
	health  map[string]*probe.HealthChecker // falls back for a server without /health
	every   time.Duration
	hang    time.Duration
	client  *http.Client
	log     *slog.Logger
}

const probeFailures = 3

func newProbeFleet(spec *job.Spec, log *slog.Logger, onState stateFunc) *probeFleet {
	urls := make([]string, 0, len(spec.Endpoints))
	engines := map[string]engine.Dialect{}
	health := map[string]*probe.HealthChecker{}
	client := &http.Client{}
	for _, e := range spec.Endpoints {
		urls = append(urls, e.URL)
		d, err := engine.Lookup(e.Engine)
		if err != nil {
			d, _ = engine.Lookup("sglang")
		}
		engines[e.URL] = d
		key := ""
		if e.APIKeyEnv != "" {
			key = os.Getenv(e.APIKeyEnv)
		}
		health[e.URL] = &probe.HealthChecker{Client: client, BaseURL: e.URL, Path: d.HealthPath, Model: spec.Model, APIKey: key}
	}
	hang := spec.Monitor.HangAfter
	if hang <= 0 {
		hang = job.DefaultHangAfter
	}
	every := probeEvery(spec)
	return &probeFleet{statusBoard: newStatusBoard(urls, onState), engines: engines, health: health, every: min(every, hang/3),
		hang: hang, client: client, log: log}
}

func (f *probeFleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, url := range f.URLs() {
		wg.Go(func() { f.watch(ctx, url) })
		wg.Go(func() { f.scrapeLoop(ctx, f.client, url, f.engines[url], f.every) })
	}
	wg.Wait()
	return nil
}

func (f *probeFleet) watch(ctx context.Context, url string) {
	d := f.engines[url]
	fails := 0
	// A wedged server whose /health still answers 200 would otherwise flap
	// STALLED -> READY every probe: after each stall it stays STALLED for a
	// cooldown that doubles while stalls repeat, and tokens after a retry
	// reset it.
	stalls := 0
	var stalledUntil time.Time
	var tokensAtRetry int64
	using := "GET " + d.HealthPath
	for {
		snap := probe.ProbeWith(ctx, f.client, url, d, f.health[url])
		if ctx.Err() != nil {
			return
		}
		if snap.HealthProbe != using {
			using = snap.HealthProbe
			f.log.Info("health probe changed", "endpoint", url, "probe", using, "because", snap.HealthFallback)
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
			f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Ready, Cause: fallbackCause(snap)})
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(f.every):
		}
	}
}

func healthCause(s probe.Snapshot) string {
	what := "health probe"
	if s.HealthFallback != "" {
		what = fmt.Sprintf("health probe %s (%s)", s.HealthProbe, s.HealthFallback)
	}
	if s.HealthErr != nil {
		return what + ": " + s.HealthErr.Error()
	}
	return fmt.Sprintf("%s: HTTP %d", what, s.HealthStatus)
}

// fallbackCause says which probe keeps a server without the engine's
// health route READY, so status and the log show it ("" for the engine's
// own).
func fallbackCause(s probe.Snapshot) string {
	if s.HealthFallback == "" {
		return ""
	}
	return fmt.Sprintf("health by %s (%s)", s.HealthProbe, s.HealthFallback)
}
