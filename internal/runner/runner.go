package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/regen-dev/regen/internal/crew"
	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/fleet"
	"github.com/regen-dev/regen/internal/ingest"
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
	// Capture, when set, runs once every sample is finished, before the
	// export (the job's hidden-state capture, so the manifest lists its
	// files), and returns a line for the view. Its error fails the run
	// after the export.
	Capture func(ctx context.Context) (string, error)
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

// IngestStats counts what one ingest pass did (see ingest.Stats).
type IngestStats = ingest.Stats

// SourceError stops a run on a source it cannot read (see ingest.SourceError).
type SourceError = ingest.SourceError

// Ingest reads every source file not yet fully ingested (see ingest.Run).
func Ingest(ctx context.Context, spec *job.Spec, st ingest.Store) (IngestStats, error) {
	return ingest.Run(ctx, spec, st)
}

// ErrInterrupted is returned when the run stopped on request before finishing.
var ErrInterrupted = errors.New("interrupted; re-run the same command to resume")

// FailedError is returned when the job cannot go on (every endpoint FAILED).
type FailedError = fleet.FailedError

// RefusedError is returned when the run cannot go on as configured: every
// endpoint refuses the job's configuration, or none answered by
// monitor.start_deadline.
type RefusedError = fleet.RefusedError

type runState struct {
	o        Options
	id       worker
	disp     *dispatch.Dispatcher
	fleet    *fleet.Fleet
	alerts   *monitor.AlertQueue
	health   monitor.StoreHealth
	crew     *crew.Crew
	beats    beats
	drain    drain
	ingested ingested
	sig      signals
	view     jobView
	capture  struct {
		ran bool  // Options.Capture was called
		err error // and failed with err
	}
}

// worker is who this runner is among the workers of the job.
type worker struct {
	owner   string
	host    string
	started time.Time
	shared  bool             // several workers may run the job at once
	gen     store.Generation // the configuration generation this run generates
}

// beats orders heartbeat writes; after an abort's last heartbeat (final
// set) no other is written. hist and rate turn the dispatcher's counters
// into history rows and the worker's rate.
type beats struct {
	mu    sync.Mutex
	final bool
	hist  *history
	rate  monitor.RateWindow
}

// drain is set at the first interrupt, while in-flight requests finish;
// since is when (unix nanoseconds).
type drain struct {
	on    atomic.Bool
	since atomic.Int64
}

// ingested: done is closed when every source file is in the store.
type ingested struct {
	done chan struct{}
	sum  IngestStats
}

// signals are signalled (never blocking): changed when a state may have
// changed, so the heartbeat and the view show it at once, not at their
// next tick; redraw when only the view should.
type signals struct {
	changed chan struct{}
	redraw  chan struct{}
}

// jobView is the job's state as this runner shows and records it.
type jobView struct {
	mu       sync.Mutex
	state    monitor.State
	evidence []string
	// notes are lines for the view to print at its next frame.
	notes    []string
	exported string // export mark once this worker wrote or found the export
}

// Run executes the job to completion, interruption or failure.
func Run(ctx context.Context, o Options) (sum Summary, err error) {
	r := newRunState(o)
	defer r.onAbort(o.Abort)()
	r.alerts = monitor.StartAlerts(context.WithoutCancel(ctx), &monitor.Alerter{Command: o.Spec.Alerts.Command, Webhook: o.Spec.Alerts.Webhook}, r.alertFailed)
	defer r.alerts.Stop()

	if err := r.untilStore(ctx, r.crew.Join); err != nil {
		r.crew.Leave()
		return sum, err
	}
	defer r.crew.Leave()
	defer r.forgetStoreNote()
	// Before anything is ingested, sent or announced by a heartbeat.
	if err := r.configure(ctx); err != nil {
		return sum, err
	}
	r.beat(ctx, false, "")
	runErr, err := r.work(ctx)
	if err != nil {
		return sum, err
	}
	sum.Ingest = r.ingested.sum
	bg := context.WithoutCancel(ctx)
	// The final report is read after the last heartbeat, so it says what
	// `regen status` will say from now on.
	defer func() {
		opts := monitor.AssessOptions{Now: time.Now(), DeadAfter: o.Spec.Monitor.DeadAfter, Host: r.id.host}
		if final, err := monitor.Assess(bg, o.Store, opts); err == nil {
			sum.Final = final
		}
	}()
	return sum, r.end(ctx, runErr, &sum)
}

// newRunState is a runner for o, with o's defaults filled in.
func newRunState(o Options) *runState {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 10 * time.Second
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	host, _ := os.Hostname()
	r := &runState{o: o, id: worker{host: host, owner: newOwner(host), started: time.Now(), shared: o.Store.Info().Shared},
		view:     jobView{state: monitor.Starting},
		sig:      signals{changed: make(chan struct{}, 1), redraw: make(chan struct{}, 1)},
		ingested: ingested{done: make(chan struct{})}}
	r.beats.hist = &history{worker: r.id.owner, started: r.id.started}
	r.crew = crew.New(crew.Config{Store: o.Store, Job: o.Spec.Name, LockFile: o.Spec.Rel(o.Store.Info().Location),
		Owner: r.id.owner, Host: r.id.host, Started: r.id.started, Shared: r.id.shared, DeadAfter: o.Spec.Monitor.DeadAfter,
		Logger: o.Logger, Event: r.event})
	return r
}

// work ingests and generates. runErr is how generation ended; err, when
// not nil, ends the run at once (its last heartbeat is written).
func (r *runState) work(ctx context.Context) (runErr, err error) {
	// The manifest says which source files are in already. With nothing
	// left to read, ingest is a glance; otherwise it runs beside the
	// dispatcher, which starts on the first committed batch.
	in := ingest.New(r.o.Spec, r.o.Store, r.o.Logger, r.wakeDispatcher)
	plan, err := in.Plan()
	if err != nil {
		return nil, r.stop(ctx, err)
	}
	toRead, err := in.Unread(ctx, plan)
	if err != nil {
		return nil, r.stop(ctx, err)
	}
	if toRead > 0 {
		return r.generate(ctx, func(ctx context.Context) error { return r.ingest(ctx, in, plan) }), nil
	}
	if err := r.ingest(ctx, in, plan); err != nil {
		return nil, r.stop(ctx, err)
	}
	// A finished job re-run only exports again: no server is started,
	// so nothing is left behind in its status but the job's own DONE.
	left, err := r.remaining(ctx)
	if err != nil {
		return nil, err
	}
	if left > 0 {
		return r.generate(ctx, nil), nil
	}
	return nil, nil
}

// end finishes the run after generation ended with runErr: FAILED,
// interrupted, refused, or DONE once exported.
func (r *runState) end(ctx context.Context, runErr error, sum *Summary) error {
	var failed *FailedError
	bg := context.WithoutCancel(ctx)
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
		return runErr
	case ctx.Err() != nil:
		r.beat(bg, true, "interrupted")
		return ErrInterrupted
	default:
		if r.fleet != nil {
			runErr = r.fleet.ExplainRefusal(bg, runErr)
		}
		return r.stop(bg, runErr)
	}
	if !r.o.NoExport {
		if err := r.export(exportCtx, sum); err != nil {
			return err
		}
	} else if err := r.captureAlone(ctx); err != nil {
		return err
	}
	if err := r.capture.err; err != nil {
		r.beat(bg, true, "capture failed: "+err.Error())
		return err
	}
	r.setState(bg, monitor.Done, nil)
	r.beat(bg, true, monitor.ExitFinished)
	r.draw(bg, "")
	return r.nothingDone(bg)
}

// export writes the output files (or waits for the worker that does).
// It keeps the heartbeat fresh while waiting for the other workers and
// during a long export, so status does not call a busy worker dead; DONE
// is declared only once the files exist.
func (r *runState) export(ctx context.Context, sum *Summary) error {
	bg := context.WithoutCancel(ctx)
	stop := r.beatEvery(bg, r.o.Spec.Monitor.HeartbeatEvery)
	var wrote bool
	var err error
	sum.Export, wrote, err = r.finish(ctx)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			r.beat(bg, true, "interrupted")
			return ErrInterrupted
		}
		r.beat(bg, true, "export failed: "+err.Error())
		return fmt.Errorf("export: %w", err)
	}
	if !wrote {
		r.view.mu.Lock()
		mark := r.view.exported
		r.view.mu.Unlock()
		r.note(fmt.Sprintf("export: already written by another worker for the same %s", mark))
	}
	return nil
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
	case <-r.ingested.done:
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
func (r *runState) ingest(ctx context.Context, in *ingest.Ingester, plan []ingest.SourcePlan) error {
	stats, err := in.Run(ctx, plan)
	r.ingested.sum = stats
	if err != nil {
		return err
	}
	close(r.ingested.done)
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
	r.fleet, err = fleet.New(fleet.Config{Spec: spec, LogDir: logDir, Logger: o.Logger, Models: st, Generation: r.id.gen.N,
		Report: fleet.Reporter{Event: r.event, Alert: r.alert, Note: r.note, Changed: func() { notify(r.sig.changed) }, StoreFailed: r.storeFailed}})
	if err != nil {
		return err
	}
	endpoints := make([]dispatch.Endpoint, 0)
	for _, url := range r.fleet.URLs() {
		_, key := r.fleet.Engine(url)
		endpoints = append(endpoints, dispatch.Endpoint{URL: url, Client: llm.New(llm.Config{
			BaseURL: url, APIKey: key, MaxConns: fleet.MaxConns(spec),
			RequestTimeout: spec.Generation.RequestTimeout, IdleTimeout: spec.Generation.IdleTimeout, HeaderTimeout: spec.Generation.HeaderTimeout,
			ProgressTimeout: fleet.ProgressTimeout(spec),
		})}) // token id fields go per request, once the server's engine is known (dispatch.Server)
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
		Store: st, Owner: r.id.owner, Model: spec.Model, Lanes: lanes, Serve: o.Lanes, Endpoints: endpoints, Params: params, Generation: r.id.gen.N,
		IngestDone:  r.ingested.done,
		MaxAttempts: spec.Retry.MaxAttempts, BaseDelay: spec.Retry.BaseDelay, MaxDelay: spec.Retry.MaxDelay,
		DrainTimeout: o.DrainTimeout, Logger: o.Logger, Observe: r.observeRequest,
		Quality: rules, Reasoning: reasoningRule(spec.Generation), KeepReasoning: spec.Generation.Reasoning == job.ReasoningKeep,
		LaneFor: spec.LaneFor, PoisonAfter: spec.Retry.PoisonAfter, BrokenStreak: spec.Retry.BrokenStreak, BrokenAfter: spec.Monitor.BrokenAfter,
		NoAffinity: spec.Balance == job.BalanceTokens, NoAdmission: spec.Balance == job.BalanceAffinityOnly,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	r.disp = disp
	r.fleet.Attach(disp)
	if r.id.shared {
		r.shareEndpoints(ctx) // before the first claim: the others' heartbeats are there already
	}
	return r.runLoops(ctx, ingest)
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

// setState records a job state change as an event and fires alerts.
func (r *runState) setState(ctx context.Context, s monitor.State, evidence []string) {
	r.view.mu.Lock()
	prev := r.view.state
	r.view.state, r.view.evidence = s, evidence
	r.view.mu.Unlock()
	if prev == s {
		return
	}
	notify(r.sig.redraw)
	r.event(ctx, store.Event{Kind: "job_state", Subject: "job", State: string(s), Evidence: fleet.JoinEvidence(evidence)})
	r.alert(ctx, monitor.Transition{Job: r.o.Spec.Name, Subject: "job", From: prev, To: s, Time: time.Now(), Evidence: evidence})
}

// alert queues t for the alert hooks; it never blocks.
func (r *runState) alert(ctx context.Context, t monitor.Transition) { r.alerts.Send(ctx, t) }

// alertFailed records a transition whose hook failed or was dropped.
func (r *runState) alertFailed(ctx context.Context, t monitor.Transition, err error) {
	if errors.Is(err, monitor.ErrAlertDropped) {
		r.o.Logger.Warn("alert dropped", "subject", t.Subject, "from", t.From, "to", t.To, "queued", monitor.AlertQueueSize)
	} else {
		r.o.Logger.Warn("alert hook failed", "err", err)
	}
	r.event(ctx, store.Event{Kind: "alert_failed", Subject: t.Subject, State: string(t.To), Evidence: err.Error()})
}

// observeRequest feeds one finished request to regen's own metrics and
// each answer to the fleet.
func (r *runState) observeRequest(a dispatch.Attempt) {
	if r.o.Metrics != nil {
		r.o.Metrics.ObserveRequest(a.Lane, a.Endpoint, a.Outcome, a.Duration, a.TTFT, a.CompletionTokens)
	}
	if a.Outcome == dispatch.OutcomeOK {
		r.fleet.ObserveAnswer(a.Endpoint, a.TokenIDs)
	}
}
