package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/llm"
)

const (
	maxClaim    = 64 // samples per Claim call, to keep store transactions small
	minPoll     = 200 * time.Millisecond
	maxPoll     = time.Second
	maxCheckGap = 5 * time.Second
	// A failing store is retried with backoff between these gaps, for as
	// long as it takes: results wait in memory (bounded by the lanes'
	// concurrency, since nothing new is claimed meanwhile).
	storeRetryGap    = 100 * time.Millisecond
	maxStoreRetryGap = 5 * time.Second
)

// Errors used as cancellation causes, telling a worker to release its sample.
var (
	errPaused = errors.New("endpoint paused")
	errDrain  = errors.New("dispatcher draining")
	errMoved  = errors.New("moved to an endpoint with room")
	errShed   = errors.New("shed to relieve KV pressure on a server that crashed under it")
)

// Dispatcher claims samples from the store and sends them to endpoints.
type Dispatcher struct {
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	lanes []*lane
	eps   []*endpoint

	laneByName map[string]*lane
	epByURL    map[string]*endpoint

	wake    chan struct{} // capacity 1: "something changed, look again"
	workers sync.WaitGroup
	serve   map[string]bool
	// aborted is closed when the drain gives up: store writes still being
	// retried stop, and their samples come back through lease expiry.
	aborted   chan struct{}
	abortOnce sync.Once
	// storeBack tells the lease keeper to extend leases at once after an
	// outage, before anyone's expiry scan can take them.
	storeBack chan struct{}

	guard *poisonGuard
	// historyReused counts turns built from their conversation's kept
	// history (history.go); nextTurns the turns after a first one claimed,
	// keptClaims those of them the store handed over Kept (without their
	// body and answers). Run's last line reports them.
	historyReused, nextTurns, keptClaims atomic.Int64
	// logs rate-limits log lines that can repeat fast.
	logs *logRate

	mu        sync.Mutex
	running   bool
	stopping  bool // Run's loop ended: draining or done
	startedAt time.Time
	inflight  int // samples claimed and not yet settled in the store
	rr        int // round-robin cursor for balancing ties
	// firstResume is when an endpoint was first resumed (startHoldLocked).
	firstResume time.Time
	counters    Counters
	storeSt     StoreStats
	// storeRetrying counts store calls currently retrying a failure.
	storeRetrying int
	fatalErr      error
	stopLoop      context.CancelCauseFunc
	// held are the samples this dispatcher claimed and has not settled,
	// with the fencing token of the lease it holds now: a sample claimed
	// again after its lease was lost (a pause past dead_after) stays held
	// when the request of the lost lease settles.
	held map[string]int64
	// unsure counts store calls that failed (a claim that may have committed
	// with its reply lost; a release a database crash may have undone);
	// reconciled is its value at the last reconcile.
	// reply lost, leasing samples nobody here knows about.
	unsure, reconciled int64
	// suspects are samples whose last request failed with a server-down
	// error, to tell a fault that follows one sample from an outage
	// (fault.go); bounded by maxSuspects.
	suspects map[string]suspect
	// faulted are samples whose last request failed with a server error,
	// and when (burn.go); bounded by maxFaulted.
	faulted map[string]faultMark
	// adm is conversation-level admission's state (admit.go).
	adm admission
}

// lane is a LaneConfig with its limiter and polling state (guarded by
// Dispatcher.mu).
type lane struct {
	cfg  LaneConfig
	idx  int           // position in Dispatcher.lanes and endpoint.lanes
	lim  *Limiter      // the fixed limit; unused for an auto lane
	auto *limit.Bounds // nil for a fixed lane
	// sampling is what its requests send (provenance.go).
	sampling json.RawMessage
	// Completion lengths seen, for the token estimate of a request.
	outSum float64
	outN   int

	// short: the last Claim returned fewer samples than asked, so the lane
	// is believed empty until nextPoll or until work is put back into it.
	short    bool
	nextPoll time.Time
	backoff  time.Duration
	// emptyAt and fullAt are when a Claim last returned fewer samples than
	// asked and all it asked: the burn guard's "nothing else left to
	// compare with" (burn.go), which putting work back does not reset.
	emptyAt, fullAt time.Time
	// backlog is claimed samples kept unsent until an endpoint they are
	// homed on has room (backlog.go).
	backlog []waiting
	// admBlocked: a new conversation of the lane found no endpoint
	// admitting it since the last held one left (admit.go, claimCapLocked;
	// guarded by Dispatcher.mu).
	admBlocked bool
	// chain is what the lane counts to hold escalations back at the end
	// of the job (chains.go; guarded by Dispatcher.mu).
	chain chainState

	// durations of the lane's last answered requests, for the views' ETA
	// of the work in flight (tail.go).
	durations recentDurations
	// answered and escalated count the lane's answers since Run started
	// and those truncated into a bigger lane, for the views' ETA: a lane's
	// last answers that escalate still have a whole request to go.
	answered, escalated int64
}

// New checks cfg, applies defaults and returns a Dispatcher ready to Run.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Store == nil {
		return nil, errors.New("dispatch config: no store")
	}
	if cfg.Owner == "" {
		return nil, errors.New("dispatch config: no owner")
	}
	if len(cfg.Lanes) == 0 {
		return nil, errors.New("dispatch config: no lanes")
	}
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("dispatch config: no endpoints")
	}
	applyDefaults(&cfg)

	d := &Dispatcher{
		cfg:        cfg,
		log:        cfg.Logger,
		now:        cfg.Now,
		laneByName: map[string]*lane{},
		epByURL:    map[string]*endpoint{},
		wake:       make(chan struct{}, 1),
		aborted:    make(chan struct{}),
		storeBack:  make(chan struct{}, 1),
		held:       map[string]int64{},
		guard:      newPoisonGuard(cfg.PoisonAfter),
		logs:       newLogRate(10 * time.Second),
		suspects:   map[string]suspect{},
		faulted:    map[string]faultMark{},
	}
	for _, lc := range cfg.Lanes {
		if lc.Name == "" {
			return nil, errors.New("dispatch config: lane without a name")
		}
		if _, dup := d.laneByName[lc.Name]; dup {
			return nil, fmt.Errorf("dispatch config: lane %q listed twice", lc.Name)
		}
		if lc.Auto == nil && lc.Concurrency < 1 {
			return nil, fmt.Errorf("dispatch config: lane %q: concurrency %d, want >= 1", lc.Name, lc.Concurrency)
		}
		l := &lane{cfg: lc, idx: len(d.lanes), lim: NewLimiter(lc.Concurrency), auto: lc.Auto, backoff: minPoll,
			sampling: sampling(cfg.Params, lc.MaxTokens)}
		d.lanes = append(d.lanes, l)
		d.laneByName[lc.Name] = l
	}
	for _, l := range d.lanes {
		if err := d.checkEscalation(l); err != nil {
			return nil, err
		}
	}
	if err := d.setServe(cfg.Serve); err != nil {
		return nil, err
	}
	for _, ec := range cfg.Endpoints {
		if ec.URL == "" || ec.Client == nil {
			return nil, fmt.Errorf("dispatch config: endpoint %q needs a URL and a client", ec.URL)
		}
		if _, dup := d.epByURL[ec.URL]; dup {
			return nil, fmt.Errorf("dispatch config: endpoint %q listed twice", ec.URL)
		}
		e := &endpoint{url: ec.URL, client: ec.Client, calls: map[*call]struct{}{}, errors: map[llm.Class]int64{}, lanes: make([]epLane, len(d.lanes))}
		e.load.forgetKV()
		params := limit.DefaultParams
		if cfg.LimitParams != nil {
			params = *cfg.LimitParams
		}
		for _, l := range d.lanes {
			if l.auto != nil {
				e.lanes[l.idx].ctl = limit.New(*l.auto, params, cfg.Now())
			}
		}
		d.eps = append(d.eps, e)
		d.epByURL[ec.URL] = e
	}
	return d, nil
}

// setServe limits the lanes this worker claims from to names (nil = all).
func (d *Dispatcher) setServe(names []string) error {
	if names == nil {
		return nil
	}
	d.serve = map[string]bool{}
	for _, name := range names {
		if _, ok := d.laneByName[name]; !ok {
			return fmt.Errorf("dispatch config: serve lists unknown lane %q", name)
		}
		d.serve[name] = true
	}
	if len(d.serve) == 0 {
		return errors.New("dispatch config: serve lists no lane")
	}
	return nil
}

// checkEscalation follows l's escalation chain: every lane named must exist
// and the chain must end, or a truncated sample would bounce forever.
func (d *Dispatcher) checkEscalation(l *lane) error {
	seen := map[string]bool{l.cfg.Name: true}
	for cur := l; cur.cfg.EscalateTo != ""; {
		next, ok := d.laneByName[cur.cfg.EscalateTo]
		if !ok {
			return fmt.Errorf("dispatch config: lane %q escalates to unknown lane %q", cur.cfg.Name, cur.cfg.EscalateTo)
		}
		if seen[next.cfg.Name] {
			return fmt.Errorf("dispatch config: lane %q: escalation loops back to %q", l.cfg.Name, next.cfg.Name)
		}
		seen[next.cfg.Name] = true
		cur = next
	}
	return nil
}

// serves reports whether this dispatcher claims from lane name.
func (d *Dispatcher) serves(name string) bool { return d.serve == nil || d.serve[name] }

// Wake makes the claim loop look for work at once (new samples were
// ingested, or another worker returned some).
func (d *Dispatcher) Wake() {
	d.mu.Lock()
	for _, l := range d.lanes {
		l.short = false
	}
	d.mu.Unlock()
	d.signal()
}

// signal wakes the claim loop without blocking.
func (d *Dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run dispatches until no sample of the configured lanes is pending or
// leased (it returns nil) or ctx ends. When ctx ends it stops claiming, waits
// up to DrainTimeout for in-flight requests to finish and be stored, cancels
// the rest, releases their samples without spending attempts and returns
// ctx.Err(). A failing store does not stop Run: writes are retried until
// it is back (see storeDo). Run may be called once.
func (d *Dispatcher) Run(ctx context.Context) error {
	d.mu.Lock()
	if d.running {
		d.mu.Unlock()
		return errors.New("dispatch: Run called twice")
	}
	d.running = true
	d.startedAt = d.now()
	loopCtx, stopLoop := context.WithCancelCause(ctx)
	d.stopLoop = stopLoop
	d.mu.Unlock()
	defer stopLoop(nil)

	// Requests and store writes outlive ctx: in-flight work must be able to
	// finish and be recorded during the drain.
	storeCtx := context.WithoutCancel(ctx)
	workCtx, cancelWork := context.WithCancelCause(storeCtx)
	defer cancelWork(nil)

	maintCtx, stopMaint := context.WithCancel(storeCtx)
	maintDone := make(chan struct{})
	go func() {
		defer close(maintDone)
		d.maintain(maintCtx, storeCtx)
	}()

	err := d.loop(loopCtx, workCtx, storeCtx)
	d.releaseBacklog(storeCtx)
	d.mu.Lock()
	d.stopping = true // no new backups: what runs now only finishes
	d.mu.Unlock()
	if err != nil {
		d.drain(cancelWork)
	}
	d.workers.Wait() // settled workers may still be returning
	stopMaint()
	<-maintDone
	d.abort()

	d.mu.Lock()
	fatal := d.fatalErr
	d.mu.Unlock()
	if fatal != nil {
		return fatal
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// fatal stops Run with err (the poison guard: the configuration makes every
// request fail).
func (d *Dispatcher) fatal(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fatalErr == nil {
		d.fatalErr = err
		d.log.Error("dispatch stopping", "err", err)
	}
	d.stopLoop(err)
}

// abort stops every store write still being retried.
func (d *Dispatcher) abort() { d.abortOnce.Do(func() { close(d.aborted) }) }

// drain waits for in-flight requests up to DrainTimeout, then cancels the
// rest, which release their samples, and waits for them.
func (d *Dispatcher) drain(cancelWork context.CancelCauseFunc) {
	done := make(chan struct{})
	go func() {
		d.workers.Wait()
		close(done)
	}()
	d.mu.Lock()
	n := d.inflight
	d.mu.Unlock()
	d.log.Info("draining", "in_flight", n, "timeout", d.cfg.DrainTimeout)
	t := time.NewTimer(d.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	d.mu.Lock()
	n = d.inflight
	d.mu.Unlock()
	d.log.Info("drain timeout, releasing in-flight samples", "in_flight", n)
	cancelWork(errDrain)
	// Samples whose release cannot be written (the store is down) stay
	// leased to this owner; the next run or another worker returns them.
	// With the store down there is nothing to wait for: the exit comes at
	// the drain timeout, not a second one later.
	d.mu.Lock()
	down := d.storeSt.Down
	d.mu.Unlock()
	if !down {
		t.Reset(min(d.cfg.DrainTimeout, releaseGrace))
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
	d.log.Warn("store writes still failing after the drain; leaving their samples to lease expiry")
	d.abort()
	<-done
}

// releaseGrace bounds the releases after a drain timeout: they take
// milliseconds with a store that answers.
const releaseGrace = 5 * time.Second
