package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// Options configure one run.
type Options struct {
	Spec   *job.Spec
	Store  store.Store
	Logger *slog.Logger
	// Progress, when set, receives a frame every ProgressEvery, at once
	// when a state changes or a note is due, and a last one at the end.
	// It is called from one goroutine at a time; the terminal view
	// (ui.Progress.Show) subscribes here.
	Progress func(monitor.Frame)
	// ProgressEvery is the frames' period; default 10s.
	ProgressEvery time.Duration
	// DrainTimeout bounds the wait for in-flight requests after the first interrupt.
	DrainTimeout time.Duration
	// NoExport skips the export at the end (tests).
	NoExport bool
	// Lanes limits the lanes this worker claims from (nil = all). Workers
	// sharing a store may split the lanes between them.
	Lanes []string
	// Metrics, when set, is fed every request (regen's own /metrics).
	Metrics *monitor.Metrics
	// NewConfig accepts a job configuration other than the store's: it
	// starts a new configuration generation and every sample is generated
	// again (without it such a run is refused with a *ConfigError).
	NewConfig bool
	// Version is regen's version, for the export's manifest and card.
	Version string
	// Abort, when a channel arrives on it (the second Ctrl-C), has the
	// runner release its leases and write its last heartbeat (exited,
	// aborted) at once, then close that channel: the caller exits the
	// process and `regen status` says STOPPED, not DEAD.
	Abort <-chan chan struct{}
}

// Summary is what a finished run reports.
type Summary struct {
	Ingest IngestStats
	Export export.Summary
	Final  monitor.Report
}

// ErrInterrupted is returned when the run stopped on request before finishing.
var ErrInterrupted = errors.New("interrupted; re-run the same command to resume")

// FailedError is returned when the job cannot go on (every endpoint FAILED).
type FailedError struct {
	Cause    string
	Evidence []string
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("job failed: %s", e.Cause)
}

type runState struct {
	o       Options
	owner   string
	host    string
	started time.Time
	shared  bool             // several workers may run the job at once
	gen     store.Generation // the configuration generation this run generates
	disp    *dispatch.Dispatcher
	fleet   fleet
	hist    *history // per-minute rows for the views
	alerter *monitor.Alerter
	health  storeHealth
	rate    rateWindow
	// rescued remembers the heartbeat time at which a dead worker's leases
	// were released (owned by the heartbeat loop after start).
	rescued map[string]time.Time
	// disown releases the runner lock of a single-runner store (nil until
	// taken; see own).
	disown func() error
	// draining is set at the first interrupt, while in-flight requests
	// finish; drainSince is when (unix nanoseconds).
	draining   atomic.Bool
	drainSince atomic.Int64
	// beatMu orders heartbeat writes; after an abort's last heartbeat
	// (final set) no other is written.
	beatMu   sync.Mutex
	final    bool
	exported string // export mark once this worker wrote or found the export (guarded by mu)
	// ingestDone is closed when every source file is in the store.
	ingestDone chan struct{}
	ingestSum  IngestStats
	// alerts queues transitions for the alert loop, so a slow hook never
	// holds up the supervisor's callback or the heartbeat.
	alerts     chan monitor.Transition
	alertsDone chan struct{}

	// changed is signalled (never blocking) when a state may have changed,
	// so the heartbeat and the view show it at once, not at their next tick.
	changed chan struct{}
	redraw  chan struct{}

	mu       sync.Mutex
	jobState monitor.State
	evidence []string
	// shown is each endpoint as last reported (after the breaker's verdict),
	// so its Since is the time of the last transition.
	shown map[string]monitor.EndpointStatus
	// modelRefusals and modelWarnings hold what checkModel found per URL.
	modelRefusals map[string]string
	modelWarnings map[string]string
	// overruled holds, per URL, a verdict that differs from the fleet's
	// (State, Cause, Since it began) until it has lasted breakerSettle.
	overruled map[string]monitor.EndpointStatus
	// notes are lines for the view to print at its next frame.
	notes []string
}

// note has the view print line at once, above its next frame.
func (r *runState) note(line string) {
	r.mu.Lock()
	r.notes = append(r.notes, line)
	r.mu.Unlock()
	notify(r.redraw)
}

// Run executes the job to completion, interruption or failure.
func Run(ctx context.Context, o Options) (sum Summary, err error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 10 * time.Second
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	spec, st := o.Spec, o.Store
	host, _ := os.Hostname()
	r := &runState{o: o, host: host, owner: newOwner(host), started: time.Now(), jobState: monitor.Starting,
		alerter: &monitor.Alerter{Command: spec.Alerts.Command, Webhook: spec.Alerts.Webhook},
		changed: make(chan struct{}, 1), redraw: make(chan struct{}, 1),
		shown: map[string]monitor.EndpointStatus{}, modelRefusals: map[string]string{}, modelWarnings: map[string]string{},
		overruled: map[string]monitor.EndpointStatus{},
		shared:    st.Info().Shared, rescued: map[string]time.Time{}, ingestDone: make(chan struct{})}
	r.hist = &history{worker: r.owner, started: r.started}
	defer r.onAbort(o.Abort)()
	r.startAlerts(context.WithoutCancel(ctx))
	defer r.stopAlerts()

	if err := r.untilStore(ctx, r.takeOver); err != nil {
		r.release()
		return sum, err
	}
	defer r.release()
	defer r.forgetStoreNote()
	// Before anything is ingested, sent or announced by a heartbeat.
	if err := r.configure(ctx); err != nil {
		return sum, err
	}
	r.beat(ctx, false, "")

	// The manifest says which source files are in already. With nothing
	// left to read, ingest is a glance; otherwise it runs beside the
	// dispatcher, which starts on the first committed batch.
	in := &ingester{spec: spec, st: st, log: o.Logger, wake: r.wakeDispatcher}
	plan, err := in.plan()
	if err != nil {
		return sum, r.stop(ctx, err)
	}
	toRead, err := in.unread(ctx, plan)
	if err != nil {
		return sum, r.stop(ctx, err)
	}
	var runErr error
	if toRead == 0 {
		if err := r.ingest(ctx, in, plan); err != nil {
			return sum, r.stop(ctx, err)
		}
		// A finished job re-run only exports again: no server is started,
		// so nothing is left behind in its status but the job's own DONE.
		if left, err := r.remaining(ctx); err != nil {
			return sum, err
		} else if left > 0 {
			runErr = r.generate(ctx, nil)
		}
	} else {
		runErr = r.generate(ctx, func(ctx context.Context) error { return r.ingest(ctx, in, plan) })
	}
	sum.Ingest = r.ingestSum

	var failed *FailedError
	bg := context.WithoutCancel(ctx)
	// The final report is read after the last heartbeat, so it says what
	// `regen status` will say from now on.
	defer func() {
		if final, err := monitor.Assess(bg, st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter, Host: host}); err == nil {
			sum.Final = final
		}
	}()
	// A drain can finish the job: with every sample finished, an interrupt
	// ends it DONE and exported like any other finish.
	exportCtx := ctx
	if ctx.Err() != nil && !errors.As(runErr, &failed) && r.allFinished(bg) {
		runErr, exportCtx = nil, bg
	}
	switch {
	case runErr == nil:
	case errors.As(runErr, &failed):
		r.setState(bg, monitor.Failed, failed.Evidence)
		r.beat(bg, true, failed.Cause)
		return sum, runErr
	case ctx.Err() != nil:
		r.beat(bg, true, "interrupted")
		return sum, ErrInterrupted
	default:
		return sum, r.stop(bg, r.explainRefusal(bg, runErr))
	}
	if !o.NoExport {
		// Keep the heartbeat fresh while waiting for the other workers and
		// during a long export, so status does not call a busy worker dead;
		// DONE is declared only once the files exist.
		stop := r.beatEvery(bg, spec.Monitor.HeartbeatEvery)
		var wrote bool
		sum.Export, wrote, err = r.finish(exportCtx)
		stop()
		if err != nil {
			if exportCtx.Err() != nil {
				r.beat(bg, true, "interrupted")
				return sum, ErrInterrupted
			}
			r.beat(bg, true, "export failed: "+err.Error())
			return sum, fmt.Errorf("export: %w", err)
		}
		if !wrote {
			r.mu.Lock()
			mark := r.exported
			r.mu.Unlock()
			r.note(fmt.Sprintf("export: already written by another worker for the same %s", mark))
		}
	}
	r.setState(bg, monitor.Done, nil)
	r.beat(bg, true, monitor.ExitFinished)
	r.draw(bg, "")
	return sum, r.nothingDone(bg)
}

// stop ends the run on err with its last heartbeat. A source it cannot
// read makes the job FAILED with what to fix: a re-run would fail the same
// way.
func (r *runState) stop(ctx context.Context, err error) error {
	ctx = context.WithoutCancel(ctx)
	if errors.Is(err, context.Canceled) {
		r.beat(ctx, true, "interrupted")
		return ErrInterrupted
	}
	var se *SourceError
	if errors.As(err, &se) {
		r.setState(ctx, monitor.Failed, []string{se.Fix()})
	}
	r.beat(ctx, true, err.Error())
	return err
}

// allFinished reports whether every source is in the store and no sample
// of the job is left to do.
func (r *runState) allFinished(ctx context.Context) bool {
	select {
	case <-r.ingestDone:
	default:
		return false
	}
	left, err := r.remaining(ctx)
	return err == nil && left == 0
}

// remaining counts the job's samples not finished yet (pending or leased),
// in every lane.
func (r *runState) remaining(ctx context.Context) (int, error) {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		return 0, fmt.Errorf("count samples: %w", err)
	}
	_, total := monitor.Cells(counts)
	return total.Pending + total.InFlight, nil
}

// ingest brings the sources in (beside the dispatcher when generate runs
// it), then closes ingestDone and reports.
func (r *runState) ingest(ctx context.Context, in *ingester, plan []sourcePlan) error {
	stats, err := in.run(ctx, plan)
	r.ingestSum = stats
	if err != nil {
		return err
	}
	close(r.ingestDone)
	r.note("ingest: " + stats.String())
	r.event(ctx, store.Event{Kind: "ingest", Subject: "job", Evidence: stats.String()})
	return nil
}

// wakeDispatcher has the dispatcher claim at once after an ingest commit,
// not at its next poll (up to a second later). Ingest runs beside the
// dispatcher only once it exists; before, there is nothing to wake.
func (r *runState) wakeDispatcher() {
	if r.disp != nil {
		r.disp.Wake()
	}
}

// generate starts the endpoints and the dispatcher and runs until every
// sample of this worker's lanes is finished, the fleet fails or ctx ends.
// ingest, when not nil, runs beside them.
func (r *runState) generate(ctx context.Context, ingest func(context.Context) error) error {
	spec, st, o := r.o.Spec, r.o.Store, r.o
	logDir := spec.StateDir()
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return fmt.Errorf("create log dir: %w", err)
	}
	var err error
	r.fleet, err = newFleet(spec, logDir, o.Logger, r.onEndpointState)
	if err != nil {
		return err
	}
	if pf, ok := r.fleet.(*probeFleet); ok {
		pf.onDetect = func(url, evidence string) { r.engineDetected(ctx, url, evidence) }
	}

	endpoints := make([]dispatch.Endpoint, 0)
	for _, url := range r.fleet.URLs() {
		key := ""
		for _, e := range spec.Endpoints {
			if e.URL == url && e.APIKeyEnv != "" {
				key = os.Getenv(e.APIKeyEnv)
			}
		}
		maxConns := 0
		for _, l := range spec.Lanes {
			maxConns += l.Concurrency
			if l.Auto != nil {
				maxConns += autoConns(*l.Auto)
			}
		}
		endpoints = append(endpoints, dispatch.Endpoint{URL: url, Client: llm.New(llm.Config{
			BaseURL: url, APIKey: key, MaxConns: maxConns,
			RequestTimeout: spec.Generation.RequestTimeout, IdleTimeout: spec.Generation.IdleTimeout,
			TokenIDFields: r.tokenIDFields(url),
		})})
	}
	params, err := spec.Generation.Params()
	if err != nil {
		return fmt.Errorf("generation settings: %w", err)
	}
	rules, err := qualityRules(spec.Quality)
	if err != nil {
		return fmt.Errorf("quality rules: %w", err)
	}
	lanes := make([]dispatch.LaneConfig, 0, len(spec.Lanes))
	for _, l := range spec.Lanes {
		esc, _ := spec.EscalationLane(l.Name)
		lc := dispatch.LaneConfig{Name: l.Name, Concurrency: l.Concurrency, MaxTokens: l.MaxTokens, EscalateTo: esc, BackupAt: l.BackupAt}
		if a := l.Auto; a != nil {
			lc.Auto = &limit.Bounds{Min: a.Min, Max: a.Max, Initial: a.Initial}
		}
		lanes = append(lanes, lc)
	}
	disp, err := dispatch.New(dispatch.Config{
		Store: st, Owner: r.owner, Model: spec.Model, Lanes: lanes, Serve: o.Lanes, Endpoints: endpoints, Params: params, Generation: r.gen.N,
		IngestDone:  r.ingestDone,
		MaxAttempts: spec.Retry.MaxAttempts, BaseDelay: spec.Retry.BaseDelay, MaxDelay: spec.Retry.MaxDelay,
		DrainTimeout: o.DrainTimeout, Logger: o.Logger, Observe: r.observeRequest,
		Quality: rules, Reasoning: reasoningRule(spec.Generation), KeepReasoning: spec.Generation.Reasoning == job.ReasoningKeep,
		LaneFor: spec.LaneFor, PoisonAfter: spec.Retry.PoisonAfter,
		NoAffinity: spec.Balance == job.BalanceTokens,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	r.disp = disp
	setCapacities(disp, spec, r.fleet.URLs())
	r.fleet.SetProgress(r.progressOf)
	r.fleet.SetObserver(r.observe)
	r.fleet.SetTokens(func(url string) int64 {
		for _, e := range disp.Snapshot().Endpoints {
			if e.URL == url {
				return e.TokensTotal
			}
		}
		return 0
	})
	// Endpoints start paused until the fleet reports them ready.
	for _, url := range r.fleet.URLs() {
		disp.Pause(url, "starting")
	}
	return r.runLoops(ctx, ingest)
}

// beatEvery writes heartbeats until the returned stop is called.
func (r *runState) beatEvery(ctx context.Context, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// stop ends the loop, never a write in progress: a statement
		// cancelled on the client may still commit on a PostgreSQL server,
		// after the final heartbeat, and make a finished worker look dead.
		write := context.WithoutCancel(ctx)
		tickUntil(ctx, every, func() { r.beat(write, false, "") })
	}()
	return func() { cancel(); <-done }
}

// tickUntil calls fn now and then every period until ctx ends.
func tickUntil(ctx context.Context, every time.Duration, fn func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// runLoops runs the fleet, the dispatcher, the heartbeat, the view and
// ingest (when not nil) until the dispatcher finishes, the fleet or ingest
// fails or ctx ends.
func (r *runState) runLoops(ctx context.Context, ingest func(context.Context) error) error {
	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- r.fleet.Run(fleetCtx) }()

	stopDrainNote := context.AfterFunc(ctx, r.startDrain)
	defer stopDrainNote()
	g, gctx := errgroup.WithContext(ctx)
	dispCtx, stopDisp := context.WithCancel(gctx)
	defer stopDisp()
	g.Go(func() error {
		defer stopDisp()
		return r.disp.Run(dispCtx)
	})
	if ingest != nil {
		g.Go(func() error {
			if err := ingest(dispCtx); err != nil && dispCtx.Err() == nil {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		select {
		case err := <-fleetDone:
			fleetDone <- err
			if err != nil {
				stopDisp()
				return err
			}
			return nil
		case <-dispCtx.Done():
			return nil
		}
	})
	// The heartbeat and the view outlive the first Ctrl-C: a draining runner
	// is alive and must not look DEAD. They stop once everything has returned.
	loopCtx, stopLoops := context.WithCancel(context.WithoutCancel(gctx))
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); r.heartbeatLoop(loopCtx) }()
	go func() { defer loops.Done(); r.progressLoop(loopCtx) }()

	err := g.Wait()
	stopLoops()
	loops.Wait()
	stopFleet()
	if ferr := <-fleetDone; err == nil || errors.Is(err, context.Canceled) {
		var failed *FailedError
		if errors.As(ferr, &failed) {
			err = failed
		}
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func newOwner(host string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

func (r *runState) event(ctx context.Context, e store.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Worker = r.owner
	if err := r.o.Store.AddEvent(ctx, e); err != nil {
		r.storeFailed(ctx, err)
		return
	}
	r.storeWrote(ctx)
}

// storeFailed notes that the store did not answer this runner. The start
// of an outage is logged, then a reminder at growing intervals (see
// storeHealth).
func (r *runState) storeFailed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // our own shutdown, not the store's
	}
	l := r.health.failed(err, time.Now())
	args := []any{"store", r.o.Store.Info().Location, "err", err}
	if l.unlogged > 0 {
		args = append(args, "outages_not_logged", l.unlogged)
	}
	switch l.kind {
	case logStarted:
		r.o.Logger.Warn("store down; retrying", args...)
		notify(r.changed)
	case logStillDown:
		_, since := r.health.state()
		args = append(args, "down_for", time.Since(since).Round(time.Second), "failed_calls", l.failures)
		r.o.Logger.Warn("store still down; retrying", args...)
	}
}

// storeWrote notes that a write reached the store: only a write ends an
// outage (a full disk still answers reads). The end is recorded as an
// event, now that events can be written again.
func (r *runState) storeWrote(ctx context.Context) {
	end := r.health.wrote(time.Now())
	if !end.ended {
		return
	}
	r.forgetStoreNote()
	if end.logged {
		r.o.Logger.Warn("store back", "down_for", end.downFor.Round(time.Millisecond))
	}
	r.event(ctx, store.Event{Kind: "store_state", Subject: "store", State: "UP",
		Evidence: fmt.Sprintf("back after %s down: %s", end.downFor.Round(time.Second), end.cause)})
	notify(r.changed)
}

// setState records a job state change as an event and fires alerts.
func (r *runState) setState(ctx context.Context, s monitor.State, evidence []string) {
	r.mu.Lock()
	prev := r.jobState
	r.jobState, r.evidence = s, evidence
	r.mu.Unlock()
	if prev == s {
		return
	}
	notify(r.redraw)
	r.event(ctx, store.Event{Kind: "job_state", Subject: "job", State: string(s), Evidence: joinEvidence(evidence)})
	r.alert(ctx, monitor.Transition{Job: r.o.Spec.Name, Subject: "job", From: prev, To: s, Time: time.Now(), Evidence: evidence})
}

// alertQueue bounds the transitions waiting for a slow hook.
const alertQueue = 256

// alert queues t for the alert loop; it never blocks.
func (r *runState) alert(ctx context.Context, t monitor.Transition) {
	if !r.alerter.Wants(t) {
		return
	}
	select {
	case r.alerts <- t:
	default:
		r.o.Logger.Warn("alert dropped", "subject", t.Subject, "from", t.From, "to", t.To, "queued", alertQueue)
		r.event(ctx, store.Event{Kind: "alert_failed", Subject: t.Subject, State: string(t.To),
			Evidence: fmt.Sprintf("dropped: %d alerts already waiting for the hook", alertQueue)})
	}
}

// startAlerts runs the hooks one transition at a time, in order.
func (r *runState) startAlerts(ctx context.Context) {
	r.alerts = make(chan monitor.Transition, alertQueue)
	r.alertsDone = make(chan struct{})
	go func() {
		defer close(r.alertsDone)
		for t := range r.alerts {
			if err := r.alerter.Notify(ctx, t); err != nil {
				r.o.Logger.Warn("alert hook failed", "err", err)
				r.event(ctx, store.Event{Kind: "alert_failed", Subject: t.Subject, State: string(t.To), Evidence: err.Error()})
			}
		}
	}()
}

// stopAlerts delivers the queued alerts (each hook is bounded by the
// alerter's timeout), so a FAILED alert goes out before Run returns.
func (r *runState) stopAlerts() {
	close(r.alerts)
	<-r.alertsDone
}

// onEndpointState is the fleet's callback: pause or resume dispatch, record, alert.
func (r *runState) onEndpointState(ctx context.Context, prev, cur monitor.EndpointStatus) {
	r.event(ctx, store.Event{Kind: "endpoint_state", Subject: cur.URL, State: string(cur.State),
		Evidence: joinEvidence(append([]string{cur.Cause}, cur.Evidence...))})
	r.alert(ctx, monitor.Transition{Job: r.o.Spec.Name, Subject: cur.URL, From: prev.State, To: cur.State, Time: time.Now(),
		Evidence: append([]string{cur.Cause}, cur.Evidence...)})
	if r.disp != nil {
		switch cur.State {
		case monitor.Ready, monitor.Degraded:
			// Readiness includes serving the job's model, where the engine
			// would otherwise refuse every request.
			refusal := ""
			if prev.State != monitor.Ready && prev.State != monitor.Degraded {
				refusal = r.checkModel(ctx, cur.URL)
				r.mu.Lock()
				if refusal == "" {
					delete(r.modelRefusals, cur.URL)
				} else {
					r.modelRefusals[cur.URL] = refusal
				}
				r.mu.Unlock()
			}
			r.mu.Lock()
			refusal = r.modelRefusals[cur.URL]
			r.mu.Unlock()
			if refusal == "" {
				r.disp.Resume(cur.URL)
			} else {
				r.disp.Pause(cur.URL, "model not served")
			}
		default:
			reason := string(cur.State)
			if cur.Cause != "" {
				reason += ": " + cur.Cause
			}
			r.disp.Pause(cur.URL, reason)
			if cur.State == monitor.Down && prev.State != monitor.Down {
				r.noteCrash(ctx, cur)
			}
		}
	}
	notify(r.changed)
}

// notify signals ch without blocking; one pending signal is enough.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// progressOf gives a supervisor the token-progress evidence for one endpoint.
func (r *runState) progressOf(url string) (inFlight int, lastToken time.Time) {
	for _, e := range r.disp.Snapshot().Endpoints {
		if e.URL == url {
			// A request that has not produced a token yet counts from when the endpoint became busy.
			last := e.LastTokenAt
			if e.BusySince.After(last) {
				last = e.BusySince
			}
			return e.InFlight, last
		}
	}
	return 0, time.Time{}
}

func joinEvidence(ev []string) string {
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

// live gathers the runner's current evidence. When the store does not
// answer it uses the last counts read and says the store is down.
func (r *runState) live(ctx context.Context) (monitor.Live, []monitor.CellCounts) {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		r.storeFailed(ctx, err)
		counts, _ = r.health.last()
	} else {
		r.health.keep(counts)
	}
	out, total := monitor.Cells(counts)
	snap := r.disp.Snapshot()
	now := time.Now()
	l := monitor.Live{Now: now, StartedAt: r.started, Remaining: total.Pending + total.InFlight, StallAfter: r.o.Spec.Monitor.StallAfter,
		Endpoints: r.endpoints(ctx, snap, now)}
	l.StoreDown, l.StoreDownSince = r.health.state()
	if snap.Store.Down && (l.StoreDown == "" || snap.Store.Since.Before(l.StoreDownSince)) {
		l.StoreDown, l.StoreDownSince = snap.Store.LastError, snap.Store.Since
	}
	for _, e := range snap.Endpoints {
		l.InFlight += e.InFlight
		if e.LastTokenAt.After(l.LastTokenAt) {
			l.LastTokenAt = e.LastTokenAt
		}
	}
	return l, out
}

// probeEvery is how often the servers are probed (their load read): the
// job's monitor.probe_every, or its default for a spec built without one.
func probeEvery(spec *job.Spec) time.Duration {
	if d := spec.Monitor.ProbeEvery; d > 0 {
		return d
	}
	return job.DefaultProbeEvery
}

// endpoints is each endpoint as the fleet sees it, with the dispatcher's
// counters and the breaker's verdict, and Since the time of its last
// transition.
func (r *runState) endpoints(ctx context.Context, snap dispatch.Snapshot, now time.Time) []monitor.EndpointStatus {
	eps := r.fleet.Statuses()
	for i, raw := range eps {
		for _, e := range snap.Endpoints {
			if e.URL != raw.URL {
				continue
			}
			eps[i].InFlight = e.InFlight
			eps[i].LastTokenAt = e.LastTokenAt
			eps[i].Tokens = e.TokensTotal
			limitsOf(e, &eps[i], now, probeEvery(r.o.Spec))
			// Healthy by its probe but refusing our requests (wrong model name,
			// bad key, dying engine): the breaker is the truth, with its reason.
			// Half-open is no better until its probe request succeeds: a
			// killed server must not read READY while that request hangs.
			if e.Breaker != "closed" && (raw.State == monitor.Ready || raw.State == monitor.Degraded) {
				eps[i].State = monitor.Down
				eps[i].Cause = "requests fail: " + e.LastServerDown
				eps[i].Evidence = nil
			}
		}
		r.mu.Lock()
		refusal, warning := r.modelRefusals[raw.URL], r.modelWarnings[raw.URL]
		r.mu.Unlock()
		if refusal != "" && (raw.State == monitor.Ready || raw.State == monitor.Degraded) {
			eps[i].State, eps[i].Cause, eps[i].Evidence = monitor.Down, "model not served", []string{refusal}
		}
		if warning != "" {
			eps[i].Evidence = append(slices.Clone(eps[i].Evidence), warning)
		}
		eps[i] = r.settle(ctx, raw, eps[i], now)
	}
	return eps
}

// breakerSettle is how long the breaker's verdict must differ from the
// fleet's before it is shown: a crashing server fails its requests a moment
// before its supervisor reports it, and that is one transition, not two.
const breakerSettle = time.Second

// settle gives cur (the fleet's raw status, maybe overruled by the breaker
// or the model check) the time of its last transition. A transition the
// fleet did not report itself is recorded (kind "breaker"), alerted and
// shown at once here, once it has lasted breakerSettle; its Since is when
// it began.
func (r *runState) settle(ctx context.Context, raw, cur monitor.EndpointStatus, now time.Time) monitor.EndpointStatus {
	r.mu.Lock()
	prev, seen := r.shown[cur.URL]
	same := seen && prev.State == cur.State && prev.Cause == cur.Cause
	fleetReported := cur.State == raw.State && cur.Cause == raw.Cause && raw.Since.After(prev.Since)
	record := false
	switch {
	case same:
		cur.Since = prev.Since
		delete(r.overruled, cur.URL)
	case fleetReported || !seen:
		// The fleet's own transition, with its time, recorded by onEndpointState.
		delete(r.overruled, cur.URL)
	default:
		// The verdict's clock runs from when its state began: a killed
		// server's requests fail first mid-stream, then at connect, and
		// that new wording is the same outage, not a new one to wait out.
		began, pending := r.overruled[cur.URL]
		if !pending || began.State != cur.State {
			began = monitor.EndpointStatus{State: cur.State, Cause: cur.Cause, Since: now}
			r.overruled[cur.URL] = began
		}
		if now.Sub(began.Since) < breakerSettle {
			// Not yet: keep showing the previous state.
			r.mu.Unlock()
			prev.InFlight, prev.LastTokenAt, prev.Tokens, prev.Load = cur.InFlight, cur.LastTokenAt, cur.Tokens, cur.Load
			return prev
		}
		delete(r.overruled, cur.URL)
		cur.Since = began.Since
		record = true
	}
	shown := cur
	shown.Evidence = slices.Clone(cur.Evidence)
	r.shown[cur.URL] = shown
	r.mu.Unlock()
	if record {
		ev := append([]string{cur.Cause}, cur.Evidence...)
		r.event(ctx, store.Event{Time: cur.Since, Kind: "breaker", Subject: cur.URL, State: string(cur.State), Evidence: joinEvidence(ev)})
		r.alert(ctx, monitor.Transition{Job: r.o.Spec.Name, Subject: cur.URL, From: prev.State, To: cur.State, Time: cur.Since, Evidence: ev})
		notify(r.changed)
	}
	return cur
}

func (r *runState) tokens() int64 {
	var n int64
	for _, e := range r.disp.Snapshot().Endpoints {
		n += e.TokensTotal
	}
	return n
}

// watchEvery is how often the heartbeat loop looks at the endpoints (in
// memory) for a transition to write and show at once.
const watchEvery = 250 * time.Millisecond

// heartbeatLoop writes the heartbeat every heartbeat_every, and at once
// when a state changes, so `regen status` and the view learn of a server
// that went down within a fraction of a second, not at the next tick.
func (r *runState) heartbeatLoop(ctx context.Context) {
	// Ending the loop must not cancel a heartbeat being written (see
	// beatEvery): the final one comes after it.
	write := context.WithoutCancel(ctx)
	step := func() {
		l, _ := r.live(ctx)
		s, ev := monitor.Evaluate(l)
		if r.draining.Load() {
			if s == monitor.Running {
				s, ev = monitor.Draining, nil
			}
			ev = append(ev, r.drainEvidence(l.InFlight))
		}
		if s != monitor.Done { // DONE is declared once the dispatcher has really finished
			r.setState(ctx, s, ev)
		}
		r.noteStoreDown(l.Now)
		// A store that is down is tried again with backoff, not every step.
		if r.health.due(l.Now) {
			r.writeBeat(write, false, "", &l)
			r.recordHistory(ctx, l.Now)
		}
		if r.shared && l.StoreDown == "" {
			if err := r.rescueDead(ctx, false); err != nil {
				r.storeFailed(ctx, err)
			}
		}
	}
	beat := time.NewTicker(r.o.Spec.Monitor.HeartbeatEvery)
	defer beat.Stop()
	watch := time.NewTicker(watchEvery)
	defer watch.Stop()
	step()
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			step()
		case <-r.changed:
			step()
			notify(r.redraw)
		case <-watch.C:
			r.endpoints(ctx, r.disp.Snapshot(), time.Now())
		}
	}
}

// observeRequest feeds one finished request to regen's own metrics.
func (r *runState) observeRequest(a dispatch.Attempt) {
	if r.o.Metrics != nil {
		r.o.Metrics.ObserveRequest(a.Lane, a.Endpoint, a.Outcome, a.Duration, a.TTFT, a.CompletionTokens)
	}
}

// beat writes the heartbeat with the runner's current view.
func (r *runState) beat(ctx context.Context, exited bool, reason string) {
	var l *monitor.Live
	if r.disp != nil && r.fleet != nil {
		live, _ := r.live(ctx)
		l = &live
	}
	r.writeBeat(ctx, exited, reason, l)
	if l != nil {
		r.recordHistory(ctx, l.Now)
	}
}

// writeBeat writes the heartbeat with live evidence already gathered (nil: none).
func (r *runState) writeBeat(ctx context.Context, exited bool, reason string, l *monitor.Live) {
	r.beatMu.Lock()
	defer r.beatMu.Unlock()
	if r.final {
		return // aborted: the last heartbeat is written
	}
	r.mu.Lock()
	b := monitor.Beat{State: r.jobState, Evidence: r.evidence, Exited: exited, ExitReason: reason, Lanes: r.o.Lanes, Exported: r.exported}
	r.mu.Unlock()
	if l != nil {
		b.Endpoints, b.InFlight, b.LastTokenAt = l.Endpoints, l.InFlight, l.LastTokenAt
		b.Tokens = r.tokens()
	}
	if r.disp != nil {
		b.Done = r.disp.Snapshot().Counters.Done
		b.Rate = r.rate.add(time.Now(), b.Done)
	}
	counters, _ := json.Marshal(b)
	hb := store.Heartbeat{Owner: r.owner, PID: os.Getpid(), Host: r.host, Time: time.Now(), Started: r.started, Counters: counters}
	if err := r.o.Store.PutHeartbeat(ctx, hb); err != nil {
		r.storeFailed(ctx, err)
		return
	}
	r.storeWrote(ctx)
}

// progressLoop publishes a frame every ProgressEvery and at once when a
// state changes, and a final frame when ctx ends.
func (r *runState) progressLoop(ctx context.Context) {
	t := time.NewTicker(r.o.ProgressEvery)
	defer t.Stop()
	shown := r.draw(ctx, "")
	for {
		select {
		case <-ctx.Done():
			r.draw(ctx, "") // the final frame
			return
		case <-t.C:
			shown = r.draw(ctx, "")
		case <-r.redraw:
			shown = r.draw(ctx, shown)
		}
	}
}

// draw publishes one frame to Options.Progress unless its states are those
// of the frame published last (skip, "" never matches) and it carries no
// note; it returns the states published.
// It works before and after the endpoints and the dispatcher exist (a
// finished job has neither).
func (r *runState) draw(ctx context.Context, skip string) string {
	// The last frame is drawn after ctx ends, so it must not depend on it.
	ctx = context.WithoutCancel(ctx)
	f := monitor.Frame{Job: r.o.Spec.Name}
	if r.disp != nil && r.fleet != nil {
		l, cells := r.live(ctx)
		snap := r.disp.Snapshot()
		f.Time, f.Cells, f.Tokens, f.InFlight, f.Endpoints = l.Now, cells, r.tokens(), l.InFlight, l.Endpoints
		for _, ls := range snap.Lanes {
			f.Lanes = append(f.Lanes, monitor.LaneTiming{Name: ls.Name, MeanDuration: ls.MeanDuration, Tail: ls.Tail,
				EscalateTo: ls.EscalateTo, Answered: ls.Answered, Escalated: ls.Escalated, InFlight: ls.InFlight})
		}
	} else {
		counts, err := r.o.Store.Counts(ctx)
		if err != nil {
			return skip
		}
		f.Time = time.Now()
		f.Cells, _ = monitor.Cells(counts)
	}
	r.mu.Lock()
	f.State, f.Evidence = r.jobState, r.evidence
	f.Notes = r.notes
	r.notes = nil
	r.mu.Unlock()
	if len(f.Notes) > 0 {
		skip = "" // a note moves the view: the frame is drawn again below it
	}
	states := string(f.State)
	for _, e := range f.Endpoints {
		states += " " + string(e.State) + ":" + e.Cause
	}
	if states == skip {
		return skip
	}
	if r.o.Progress != nil {
		r.o.Progress(f)
	}
	return states
}

// runnerAlive reports whether pid is a live regen process on this machine;
// a pid reused by an unrelated program after a crash does not count.
func runnerAlive(pid int) bool {
	if !monitor.ProcessAlive(pid) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return true // no /proc: trust the signal check
	}
	return bytes.Contains(cmdline, []byte("regen"))
}

// startDrain is the first interrupt: the job drains (DRAINING, with what
// it waits for) and the view prints a line that stays above it.
func (r *runState) startDrain() {
	r.drainSince.Store(time.Now().UnixNano())
	r.draining.Store(true)
	inFlight := 0
	if r.disp != nil {
		for _, e := range r.disp.Snapshot().Endpoints {
			inFlight += e.InFlight
		}
	}
	r.note(fmt.Sprintf("regen: interrupted: draining %d in-flight requests (drain timeout %s, until %s); press Ctrl-C again to exit now",
		inFlight, r.o.DrainTimeout, time.Unix(0, r.drainSince.Load()).Add(r.o.DrainTimeout).Format("15:04:05")))
	notify(r.changed)
}

// drainEvidence says what a draining runner waits for.
func (r *runState) drainEvidence(inFlight int) string {
	since := time.Unix(0, r.drainSince.Load())
	return fmt.Sprintf("interrupted at %s: waiting for %d requests in flight, up to the drain timeout %s (until %s); then the rest go back to pending and the runner stops",
		since.Format("15:04:05"), inFlight, r.o.DrainTimeout, since.Add(r.o.DrainTimeout).Format("15:04:05"))
}

// onAbort serves an abort request (see Options.Abort) until the returned
// stop is called.
func (r *runState) onAbort(abort <-chan chan struct{}) (stop func()) {
	if abort == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		select {
		case ack := <-abort:
			r.abort()
			close(ack)
		case <-done:
		}
	}()
	return func() { close(done) }
}

// abortBudget bounds the abort's store writes: the user asked to exit now.
const abortBudget = 3 * time.Second

// abort is the second interrupt: release this runner's leases (no attempt
// spent) and write the last heartbeat, exited, so status says STOPPED and
// the samples are pending, not held by a runner that is gone.
func (r *runState) abort() {
	ctx, cancel := context.WithTimeout(context.Background(), abortBudget)
	defer cancel()
	n, err := r.o.Store.ReleaseOwner(ctx, r.owner)
	if err != nil {
		r.o.Logger.Warn("abort: release leases", "err", err)
	}
	reason := fmt.Sprintf("aborted by a second interrupt: %d requests in flight abandoned, their samples back to pending (no attempt spent)", n)
	r.beat(ctx, true, reason)
	r.beatMu.Lock()
	r.final = true
	r.beatMu.Unlock()
}
