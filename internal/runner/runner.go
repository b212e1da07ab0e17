package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/ui"
)

// Options configure one run.
type Options struct {
	Spec     *job.Spec
	Store    store.Store
	Out      io.Writer // progress view
	Terminal bool      // redraw in place
	Logger   *slog.Logger
	// ProgressEvery is the view's refresh period; default 1s on a terminal, 10s otherwise.
	ProgressEvery time.Duration
	// DrainTimeout bounds the wait for in-flight requests after the first interrupt.
	DrainTimeout time.Duration
	// NoExport skips the export at the end (tests).
	NoExport bool
	// Lanes limits the lanes this worker claims from (nil = all). Workers
	// sharing a store may split the lanes between them.
	Lanes []string
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
	shared  bool // several workers may run the job at once
	disp    *dispatch.Dispatcher
	fleet   fleet
	alerter *monitor.Alerter
	health  storeHealth
	rate    rateWindow
	// rescued remembers the heartbeat time at which a dead worker's leases
	// were released (owned by the heartbeat loop after start).
	rescued  map[string]time.Time
	exported string // export mark once this worker wrote or found the export

	viewMu sync.Mutex
	view   *ui.Progress
	// ingestDone is closed when every source file is in the store.
	ingestDone chan struct{}
	ingestSum  IngestStats
	// alerts queues transitions for the alert loop, so a slow hook never
	// holds up the supervisor's callback or the heartbeat.
	alerts     chan monitor.Transition
	alertsDone chan struct{}

	mu       sync.Mutex
	jobState monitor.State
	evidence []string
}

// Run executes the job to completion, interruption or failure.
func Run(ctx context.Context, o Options) (sum Summary, err error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 10 * time.Second
		if o.Terminal {
			o.ProgressEvery = time.Second
		}
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	spec, st := o.Spec, o.Store
	host, _ := os.Hostname()
	r := &runState{o: o, host: host, owner: newOwner(host), started: time.Now(), jobState: monitor.Starting,
		shared: st.Info().Shared, rescued: map[string]time.Time{}, ingestDone: make(chan struct{}),
		view:    ui.NewProgress(o.Out, o.Terminal),
		alerter: &monitor.Alerter{Command: spec.Alerts.Command, Webhook: spec.Alerts.Webhook}}
	r.startAlerts(context.WithoutCancel(ctx))
	defer r.stopAlerts()

	if err := r.untilStore(ctx, r.takeOver); err != nil {
		return sum, err
	}
	r.beat(ctx, false, "")

	in := &ingester{spec: spec, st: st, log: o.Logger}
	plan, err := in.plan()
	if err != nil {
		return sum, err
	}

	logDir := filepath.Join(spec.Dir, ".regen", spec.BaseName())
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return sum, fmt.Errorf("create log dir: %w", err)
	}
	r.fleet, err = newFleet(spec, logDir, o.Logger, r.onEndpointState)
	if err != nil {
		return sum, err
	}
	if r.disp, err = r.newDispatcher(); err != nil {
		return sum, err
	}
	in.wake = r.disp.Wake
	r.fleet.SetProgress(r.progressOf)
	r.fleet.SetTokens(func(url string) int64 {
		for _, e := range r.disp.Snapshot().Endpoints {
			if e.URL == url {
				return e.TokensTotal
			}
		}
		return 0
	})
	// Endpoints start paused until the fleet reports them ready.
	for _, url := range r.fleet.URLs() {
		r.disp.Pause(url, "starting")
	}

	runErr := r.runLoops(ctx, func(ctx context.Context) error { return r.ingest(ctx, in, plan) })
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
		r.beat(bg, true, runErr.Error())
		return sum, runErr
	}
	if !o.NoExport {
		// Keep the heartbeat fresh while waiting for the other workers and
		// during a long export, so status does not call a busy worker dead;
		// DONE is declared only once the files exist.
		stop := r.beatEvery(bg, spec.Monitor.HeartbeatEvery)
		var wrote bool
		sum.Export, wrote, err = r.finish(ctx)
		stop()
		if err != nil {
			if ctx.Err() != nil {
				r.beat(bg, true, "interrupted")
				return sum, ErrInterrupted
			}
			r.beat(bg, true, "export failed: "+err.Error())
			return sum, fmt.Errorf("export: %w", err)
		}
		if !wrote {
			r.note(fmt.Sprintf("export: already written by another worker for the same %s", r.exported))
		}
	}
	r.setState(bg, monitor.Done, nil)
	r.beat(bg, true, monitor.ExitFinished)
	return sum, nil
}

// newDispatcher builds the dispatcher for the fleet's endpoints and the
// lanes this worker serves.
func (r *runState) newDispatcher() (*dispatch.Dispatcher, error) {
	spec := r.o.Spec
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
		}
		endpoints = append(endpoints, dispatch.Endpoint{URL: url, Client: llm.New(llm.Config{
			BaseURL: url, APIKey: key, MaxConns: maxConns,
			RequestTimeout: spec.Generation.RequestTimeout, IdleTimeout: spec.Generation.IdleTimeout,
		})})
	}
	params, err := spec.Generation.Params()
	if err != nil {
		return nil, fmt.Errorf("generation settings: %w", err)
	}
	lanes := make([]dispatch.LaneConfig, 0, len(spec.Lanes))
	for _, l := range spec.Lanes {
		esc, _ := spec.EscalationLane(l.Name)
		lanes = append(lanes, dispatch.LaneConfig{Name: l.Name, Concurrency: l.Concurrency, MaxTokens: l.MaxTokens, EscalateTo: esc})
	}
	d, err := dispatch.New(dispatch.Config{
		Store: r.o.Store, Owner: r.owner, Model: spec.Model, Lanes: lanes, Serve: r.o.Lanes, Endpoints: endpoints, Params: params,
		IngestDone:  r.ingestDone,
		MaxAttempts: spec.Retry.MaxAttempts, BaseDelay: spec.Retry.BaseDelay, MaxDelay: spec.Retry.MaxDelay,
		DrainTimeout: r.o.DrainTimeout, Logger: r.o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	return d, nil
}

// ingest brings the sources in while the dispatcher already works on what
// is committed, then closes ingestDone.
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

// note prints a line above the progress view.
func (r *runState) note(line string) {
	r.viewMu.Lock()
	defer r.viewMu.Unlock()
	r.view.Note(line)
}

// beatEvery writes heartbeats until the returned stop is called.
func (r *runState) beatEvery(ctx context.Context, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tickUntil(ctx, every, func() { r.beat(ctx, false, "") })
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

// runLoops runs the fleet, the dispatcher, ingest, the heartbeat and the
// view until the dispatcher finishes, the fleet fails, ingest fails or ctx
// ends.
func (r *runState) runLoops(ctx context.Context, ingest func(context.Context) error) error {
	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- r.fleet.Run(fleetCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	dispCtx, stopDisp := context.WithCancel(gctx)
	defer stopDisp()
	g.Go(func() error {
		defer stopDisp()
		return r.disp.Run(dispCtx)
	})
	g.Go(func() error {
		if err := ingest(dispCtx); err != nil && dispCtx.Err() == nil {
			return err
		}
		return nil
	})
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
	r.storeOK(ctx)
}

// storeFailed notes that the store did not answer this runner; the first
// failure of an outage is logged.
func (r *runState) storeFailed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // our own shutdown, not the store's
	}
	if r.health.failed(err, time.Now()) {
		r.o.Logger.Warn("store down; retrying", "store", r.o.Store.Info().Location, "err", err)
	}
}

// storeOK notes that the store answered; the end of an outage is recorded
// as an event, now that events can be written again.
func (r *runState) storeOK(ctx context.Context) {
	ended, downFor, cause := r.health.ok(time.Now())
	if !ended {
		return
	}
	r.o.Logger.Warn("store back", "down_for", downFor.Round(time.Millisecond))
	r.event(ctx, store.Event{Kind: "store_state", Subject: "store", State: "UP",
		Evidence: fmt.Sprintf("back after %s down: %s", downFor.Round(time.Second), cause)})
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
	if r.disp != nil {
		switch cur.State {
		case monitor.Ready, monitor.Degraded:
			r.disp.Resume(cur.URL)
		default:
			reason := string(cur.State)
			if cur.Cause != "" {
				reason += ": " + cur.Cause
			}
			r.disp.Pause(cur.URL, reason)
		}
	}
	r.event(ctx, store.Event{Kind: "endpoint_state", Subject: cur.URL, State: string(cur.State),
		Evidence: joinEvidence(append([]string{cur.Cause}, cur.Evidence...))})
	r.alert(ctx, monitor.Transition{Job: r.o.Spec.Name, Subject: cur.URL, From: prev.State, To: cur.State, Time: time.Now(),
		Evidence: append([]string{cur.Cause}, cur.Evidence...)})
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
		r.storeOK(ctx)
	}
	out, total := monitor.Cells(counts)
	snap := r.disp.Snapshot()
	l := monitor.Live{Now: time.Now(), StartedAt: r.started, Remaining: total.Pending + total.InFlight, StallAfter: r.o.Spec.Monitor.StallAfter,
		Endpoints: r.fleet.Statuses()}
	l.StoreDown, l.StoreDownSince = r.health.state()
	if snap.Store.Down && (l.StoreDown == "" || snap.Store.Since.Before(l.StoreDownSince)) {
		l.StoreDown, l.StoreDownSince = snap.Store.LastError, snap.Store.Since
	}
	for i := range l.Endpoints {
		for _, e := range snap.Endpoints {
			if e.URL != l.Endpoints[i].URL {
				continue
			}
			l.Endpoints[i].InFlight = e.InFlight
			l.Endpoints[i].LastTokenAt = e.LastTokenAt
			l.Endpoints[i].Tokens = e.TokensTotal
			// Healthy by its probe but refusing our requests (wrong model name,
			// bad key, dying engine): the breaker is the truth, with its reason.
			if e.Breaker == "open" && (l.Endpoints[i].State == monitor.Ready || l.Endpoints[i].State == monitor.Degraded) {
				l.Endpoints[i].State = monitor.Down
				l.Endpoints[i].Cause = "requests fail: " + e.LastServerDown
			}
		}
	}
	for _, e := range snap.Endpoints {
		l.InFlight += e.InFlight
		if e.LastTokenAt.After(l.LastTokenAt) {
			l.LastTokenAt = e.LastTokenAt
		}
	}
	return l, out
}

func (r *runState) tokens() int64 {
	var n int64
	for _, e := range r.disp.Snapshot().Endpoints {
		n += e.TokensTotal
	}
	return n
}

func (r *runState) heartbeatLoop(ctx context.Context) {
	tickUntil(ctx, r.o.Spec.Monitor.HeartbeatEvery, func() {
		l, _ := r.live(ctx)
		s, ev := monitor.Evaluate(l)
		if s != monitor.Done { // DONE is declared once the dispatcher has really finished
			r.setState(ctx, s, ev)
		}
		r.writeBeat(ctx, false, "", &l)
		if r.shared && l.StoreDown == "" {
			if err := r.rescueDead(ctx, false); err != nil {
				r.storeFailed(ctx, err)
			}
		}
	})
}

// beat writes the heartbeat with the runner's current view.
func (r *runState) beat(ctx context.Context, exited bool, reason string) {
	var l *monitor.Live
	if r.disp != nil && r.fleet != nil {
		live, _ := r.live(ctx)
		l = &live
	}
	r.writeBeat(ctx, exited, reason, l)
}

// writeBeat writes the heartbeat with live evidence already gathered (nil: none).
func (r *runState) writeBeat(ctx context.Context, exited bool, reason string, l *monitor.Live) {
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
	r.storeOK(ctx)
}

func (r *runState) progressLoop(ctx context.Context) {
	draw := func() {
		// The last frame is drawn after ctx ends, so it must not depend on it.
		l, cells := r.live(context.WithoutCancel(ctx))
		r.mu.Lock()
		s, ev := r.jobState, r.evidence
		r.mu.Unlock()
		r.viewMu.Lock()
		r.view.Update(ui.Frame{Time: l.Now, Job: r.o.Spec.Name, State: s, Evidence: ev, Cells: cells,
			Tokens: r.tokens(), InFlight: l.InFlight, Endpoints: l.Endpoints})
		r.viewMu.Unlock()
	}
	tickUntil(ctx, r.o.ProgressEvery, draw)
	draw() // the final frame
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
