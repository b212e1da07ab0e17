package fleet

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
	mu      sync.Mutex
	engines map[string]engine.Dialect
	health  map[string]*probe.HealthChecker // falls back for a server without /health
	// detect lists the endpoints whose job names no engine: the first
	// healthy probe asks the server (probe.Detect) before it is READY.
	detect map[string]bool
	// onDetect hears what detection found (set before Run).
	onDetect func(url, evidence string)
	// onProbe hears every health probe's result, and silent says what an
	// endpoint that never answered is ("" once it did); both set before Run.
	onProbe func(url string, snap probe.Snapshot)
	silent  func(url string) string
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
	detect := map[string]bool{}
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
		detect[e.URL] = e.Detect
	}
	hang := spec.Monitor.HangAfter
	if hang <= 0 {
		hang = job.DefaultHangAfter
	}
	every := probeEvery(spec)
	return &probeFleet{statusBoard: newStatusBoard(urls, onState), engines: engines, health: health, detect: detect,
		every: min(every, hang/3), hang: hang, client: client, log: log}
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

// watch probes url every f.every and judges it. A probe may take the
// dialect's whole probe timeout (25 s) against a stopped server, so it runs
// beside the loop: the hang rule is checked at every tick whether or not
// the probe has answered, and a server that hangs with requests in flight
// is STALLED at hang_after, not when its probe gives up.
func (f *probeFleet) watch(ctx context.Context, url string) {
	d, _ := f.Engine(url)
	w := probeWatch{using: "GET " + d.HealthPath}
	results := make(chan probe.Snapshot, 1)
	probing := false
	start := func() {
		probing = true
		go func() {
			d, _ := f.Engine(url)
			snap := probe.ProbeWith(ctx, f.client, url, d, f.health[url])
			if snap.Healthy() {
				f.detectEngine(ctx, url)
			}
			results <- snap
		}()
	}
	start()
	tick := time.NewTicker(f.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case snap := <-results:
			probing = false
			if ctx.Err() != nil {
				return
			}
			f.judge(ctx, url, &w, &snap)
		case <-tick.C:
			if probing {
				f.judge(ctx, url, &w, nil) // the hang rule alone
			} else {
				start()
			}
		}
	}
}

// probeWatch is one endpoint's probe history.
type probeWatch struct {
	fails int // failed health probes in a row
	// A wedged server whose /health still answers 200 would otherwise flap
	// STALLED -> READY every probe: after each stall it stays STALLED for a
	// cooldown that doubles while stalls repeat, and tokens after a retry
	// reset it.
	stalls        int
	stalledUntil  time.Time
	tokensAtRetry int64
	using         string // the health probe in use, logged when it changes
}

// judge sets url's state from snap (nil: a probe is still outstanding).
func (f *probeFleet) judge(ctx context.Context, url string, w *probeWatch, snap *probe.Snapshot) {
	if snap != nil && f.onProbe != nil {
		f.onProbe(url, *snap)
	}
	if snap != nil && snap.HealthProbe != w.using {
		w.using = snap.HealthProbe
		f.log.Info("health probe changed", "endpoint", url, "probe", w.using, "because", snap.HealthFallback)
	}
	inFlight, last := f.progressOf(url)
	hung := f.hang > 0 && inFlight > 0 && !last.IsZero() && time.Since(last) > f.hang
	switch {
	case snap != nil && !snap.Healthy():
		w.fails++
		if w.fails >= probeFailures || f.get(url).State == monitor.Starting {
			cause := healthCause(*snap)
			if f.silent != nil {
				if s := f.silent(url); s != "" {
					cause = s + "; " + cause
				}
			}
			f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Down, Cause: cause,
				Evidence: []string{fmt.Sprintf("%d failed health probes in a row", w.fails)}})
		} else if hung {
			f.stall(ctx, url, w, inFlight, last, healthCause(*snap))
		}
	case hung:
		health := ""
		if snap == nil {
			health = "health probe unanswered"
		} else {
			w.fails = 0
		}
		f.stall(ctx, url, w, inFlight, last, health)
	case snap == nil:
		// No verdict on health until the probe answers.
	case time.Now().Before(w.stalledUntil):
		w.fails = 0 // healthy by its probe, but it just hung: wait out the cooldown
	default:
		w.fails = 0
		if !w.stalledUntil.IsZero() {
			w.stalledUntil, w.tokensAtRetry = time.Time{}, f.tokensOf(url)
		}
		if w.stalls > 0 && f.tokensOf(url) > w.tokensAtRetry {
			w.stalls = 0 // tokens flowed after the retry: it recovered
		}
		f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Ready, Cause: fallbackCause(*snap)})
	}
}

// stall reports url STALLED: no token for hang_after with requests in
// flight; health says what its probe says meanwhile ("" when healthy).
func (f *probeFleet) stall(ctx context.Context, url string, w *probeWatch, inFlight int, last time.Time, health string) {
	if f.get(url).State == monitor.Down {
		return // already down by its probes: that says more
	}
	w.stalls++
	cooldown := min(f.hang<<(w.stalls-1), 10*time.Minute)
	w.stalledUntil = time.Now().Add(cooldown)
	ev := []string{fmt.Sprintf("no token for %s with %d requests in flight (deadline %s); next try in %s",
		time.Since(last).Round(time.Second), inFlight, f.hang, cooldown)}
	if health != "" {
		ev = append(ev, health)
	}
	// The cause stays the same while the hang lasts, so it is one event, not one per probe.
	f.set(ctx, monitor.EndpointStatus{URL: url, State: monitor.Stalled, Cause: "hang", Evidence: ev})
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
