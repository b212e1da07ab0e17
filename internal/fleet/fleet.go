package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// FailedError is returned by Run when no endpoint can be brought back.
type FailedError struct {
	Cause    string
	Evidence []string
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("job failed: %s", e.Cause)
}

// Reporter is how the fleet tells the run what it saw: records for the
// store, transitions for the alert hooks, lines for the view. Every field
// may be nil.
type Reporter struct {
	Event func(context.Context, store.Event)
	Alert func(context.Context, monitor.Transition)
	Note  func(line string)
	// Changed says an endpoint's state may have changed, so the heartbeat
	// and the view show it at once.
	Changed func()
	// StoreFailed hears a store call of the fleet's own that failed.
	StoreFailed func(context.Context, error)
}

// ServedModels records, per configuration generation, the model the servers
// answer with (store.Store.SetServedModel).
type ServedModels interface {
	SetServedModel(ctx context.Context, gen int, model string) (string, error)
}

// Config configures a fleet.
type Config struct {
	Spec   *job.Spec
	LogDir string // where a launched server's log goes
	Logger *slog.Logger
	Report Reporter
	// Models and Generation: the served model is checked against the one
	// recorded for this generation (0: not checked).
	Models     ServedModels
	Generation int
}

// Dispatcher is what the fleet reads of the dispatcher, one endpoint at a
// time, and how it steers it. *dispatch.Dispatcher implements it.
type Dispatcher interface {
	Endpoint(url string) (dispatch.EndpointStats, bool)
	Pause(url, reason string)
	Resume(url string)
	Observe(url string, m engine.Metrics, at time.Time) []dispatch.LimitDecision
	NoteCrash(url, cause string, at time.Time) []dispatch.LimitDecision
	SetCapacity(url string, tokens float64, source string)
	SetServer(url string, s dispatch.Server)
}

// keeper is what keeps the endpoints alive and judges their health: a
// prober for plain URLs, the in-process simulator, or a supervised server.
type keeper interface {
	URLs() []string
	// Run keeps the endpoints up until ctx ends; it returns a *FailedError
	// when no endpoint can be brought back.
	Run(ctx context.Context) error
	Statuses() []monitor.EndpointStatus
	board() *statusBoard
}

// Fleet is the endpoints of a run and each one's truth: its health (from
// its keeper), the dispatcher's breaker and limits for it, whether it
// serves the job's model, and the state shown for it, with the time of its
// last transition.
type Fleet struct {
	cfg    Config
	log    *slog.Logger
	keeper keeper
	// engineOf is the dialect of a URL the job left without engine, once
	// detected (nil for a launched server).
	engineOf func(url string) (engine.Dialect, bool)
	disp     Dispatcher

	mu sync.Mutex
	// shown is each endpoint as last reported (after the breaker's
	// verdict), so its Since is the time of the last transition.
	shown map[string]monitor.EndpointStatus
	// overruled holds, per URL, a verdict that differs from the keeper's
	// (State, Cause, Since it began) until it has lasted breakerSettle.
	overruled map[string]monitor.EndpointStatus
	// refusals and warnings hold what checkModel found per URL.
	refusals map[string]string
	warnings map[string]string
	// toldNoIDs holds the URLs already told their engine returns no token
	// ids (at identification, or at the first answer without them).
	toldNoIDs map[string]bool
	// render holds, per URL, what the probe of its chat render route found
	// (renders.go); servers, what the dispatcher was last told of it.
	render  map[string]*renderProbe
	servers map[string]dispatch.Server
	// start is what the start-up judgements read (startup.go).
	start *startState
}

// New builds the fleet the job names: plain endpoints, the built-in
// simulator, or a server regen launches and supervises.
func New(cfg Config) (*Fleet, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{cfg: cfg, log: cfg.Logger, shown: map[string]monitor.EndpointStatus{}, overruled: map[string]monitor.EndpointStatus{},
		refusals: map[string]string{}, warnings: map[string]string{}, toldNoIDs: map[string]bool{}, render: map[string]*renderProbe{}, servers: map[string]dispatch.Server{}, start: newStartState(time.Now())}
	spec := cfg.Spec
	var err error
	switch {
	case spec.Server == nil:
		pf := newProbeFleet(spec, cfg.Logger, f.onState)
		pf.onDetect = f.engineDetected
		pf.onProbe, pf.silent = f.start.probed, f.silentCause
		f.keeper, f.engineOf = pf, pf.Engine
	case spec.Server.Engine == "sim" && len(spec.Server.Command) == 0:
		f.keeper, err = newSimFleet(spec, cfg.LogDir, cfg.Logger, f.onState)
	default:
		f.keeper, err = newSupervisedFleet(spec, cfg.LogDir, cfg.Logger, f.onState)
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

// URLs are the endpoints, known before Run so the dispatcher can be built first.
func (f *Fleet) URLs() []string { return f.keeper.URLs() }

// Attach has the fleet steer d: it gives d the KV pools the job names,
// pauses every endpoint until it is ready, and feeds d each probe of an
// endpoint's load. Call it once, before Run.
func (f *Fleet) Attach(d Dispatcher) {
	f.disp = d
	setCapacities(d, f.cfg.Spec, f.URLs())
	b := f.keeper.board()
	b.SetProgress(f.progressOf)
	b.SetTokens(f.tokensOf)
	b.SetObserver(f.observe)
	for _, url := range f.URLs() {
		d.Pause(url, "starting")
	}
}

// progressOf is the token-progress evidence of one endpoint for its hang
// rule: requests in flight and its last token, or when it became busy for
// a request that has not produced one yet.
func (f *Fleet) progressOf(url string) (inFlight int, lastToken time.Time) {
	e, ok := f.disp.Endpoint(url)
	if !ok {
		return 0, time.Time{}
	}
	last := e.LastTokenAt
	if e.BusySince.After(last) {
		last = e.BusySince
	}
	return e.InFlight, last
}

func (f *Fleet) tokensOf(url string) int64 {
	e, _ := f.disp.Endpoint(url)
	return e.TokensTotal
}

func (f *Fleet) event(ctx context.Context, e store.Event) {
	if f.cfg.Report.Event != nil {
		f.cfg.Report.Event(ctx, e)
	}
}

func (f *Fleet) alert(ctx context.Context, t monitor.Transition) {
	if f.cfg.Report.Alert != nil {
		f.cfg.Report.Alert(ctx, t)
	}
}

func (f *Fleet) note(line string) {
	if f.cfg.Report.Note != nil {
		f.cfg.Report.Note(line)
	}
}

func (f *Fleet) changed() {
	if f.cfg.Report.Changed != nil {
		f.cfg.Report.Changed()
	}
}

// probeEvery is how often the servers are probed (their load read): the
// job's monitor.probe_every, or its default for a spec built without one.
func probeEvery(spec *job.Spec) time.Duration {
	if d := spec.Monitor.ProbeEvery; d > 0 {
		return d
	}
	return job.DefaultProbeEvery
}

// JoinEvidence joins the non-empty lines of ev with "; ".
func JoinEvidence(ev []string) string {
	out := ""
	for _, e := range ev {
		if e == "" {
			continue
		}
		if out != "" {
			out += "; "
		}
		out += e
	}
	return out
}
