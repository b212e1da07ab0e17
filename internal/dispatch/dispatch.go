package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/quality"
	"github.com/regen-dev/regen/internal/store"
)

// Chatter sends one chat completion; llm.Client implements it. onDelta is
// called for every streamed chunk with the tokens it carried.
type Chatter interface {
	Chat(ctx context.Context, req llm.Request, onDelta func(tokens int)) (llm.Result, error)
}

// Endpoint is one server URL and the client that talks to it.
type Endpoint struct {
	URL    string
	Client Chatter
}

// LaneConfig is one lane: its concurrency, its max_tokens and the lane a
// truncated sample escalates to ("" = none).
type LaneConfig struct {
	Name string
	// Concurrency is the lane's fixed limit over all endpoints; ignored
	// when Auto is set.
	Concurrency int
	// Auto gives the lane an adaptive limit per endpoint (limit.Controller)
	// within these bounds.
	Auto       *limit.Bounds
	MaxTokens  int // 0 = the server's default
	EscalateTo string
	// BackupAt is the share of MaxTokens a request must have generated to
	// get a backup in the EscalateTo lane once the store has no more work
	// for either lane (hedge.go); 0 = never.
	BackupAt float64
}

// Config configures a Dispatcher. Zero durations and counts take the defaults
// noted on each field.
type Config struct {
	Store store.Store
	Owner string // lease owner id, unique per runner process
	Model string

	Lanes []LaneConfig
	// Serve lists the lanes this dispatcher claims from (nil = all of
	// Lanes). Other lanes stay configured as escalation targets for other
	// workers sharing the store to serve.
	Serve     []string
	Endpoints []Endpoint
	// IngestDone, when not nil, is closed once every sample the job will
	// have is in the store; until then an empty queue does not end Run,
	// since more samples are still arriving.
	IngestDone <-chan struct{}
	// Params are generation settings sent with every request.
	Params map[string]json.RawMessage
	// Generation is the job's configuration generation, recorded with
	// every stored answer (store.Provenance).
	Generation int

	// Quality is the reject rules applied to every answer that is not
	// escalated; the zero value rejects nothing. Reasoning says what the
	// job asked of thinking, for the reasoning rule.
	Quality   quality.Rules
	Reasoning quality.Reasoning
	// KeepReasoning keeps earlier answers' reasoning_content in the history
	// sent for later turns (thinking chat templates expect it stripped).
	KeepReasoning bool
	// LaneFor assigns the next turn of a multi-turn sample to a lane from
	// its partition and estimated prompt tokens; nil keeps it in its lane.
	LaneFor func(partition string, promptTokens int) string
	// PoisonAfter stops Run when this many samples in a row are refused
	// with the same bad-request error before any request was accepted, and
	// caps requests in flight at that many until one is; 0 = off.
	PoisonAfter int

	MaxAttempts int           // attempts per sample for retryable errors; default 5
	BaseDelay   time.Duration // first retry delay ceiling; default 2s
	MaxDelay    time.Duration // retry delay cap; default 5m

	// Lease is the lease length, extended every Lease/3; default 2m.
	Lease time.Duration
	// DrainTimeout bounds the wait for in-flight requests when Run's context
	// ends; the rest are cancelled and released. Default 30s.
	DrainTimeout time.Duration
	// BreakerCooldown is the first open period of an endpoint's breaker
	// after a server-down error, doubled on each failed probe up to 30s;
	// default 1s.
	BreakerCooldown time.Duration
	// NoAffinity turns off conversation and shared-prefix affinity
	// (affinity.go): every request goes where token-aware balancing puts it.
	NoAffinity bool
	// LimitParams tune the adaptive limits; nil = limit.DefaultParams.
	LimitParams *limit.Params

	// Observe, when set, is told of every finished request (for regen's
	// own metrics); it must not block.
	Observe func(Attempt)

	Logger *slog.Logger
	Now    func() time.Time
}

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

	// durations of the lane's last answered requests, for the views' ETA
	// of the work in flight (tail.go).
	durations recentDurations
	// answered and escalated count the lane's answers since Run started
	// and those truncated into a bigger lane, for the views' ETA: a lane's
	// last answers that escalate still have a whole request to go.
	answered, escalated int64
}

// applyDefaults fills the zero fields of cfg with their defaults.
func applyDefaults(cfg *Config) {
	setDefault(&cfg.MaxAttempts, 5)
	setDefault(&cfg.BaseDelay, 2*time.Second)
	setDefault(&cfg.MaxDelay, 5*time.Minute)
	setDefault(&cfg.Lease, 2*time.Minute)
	setDefault(&cfg.DrainTimeout, 30*time.Second)
	setDefault(&cfg.BreakerCooldown, time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
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
	if cfg.Serve != nil {
		d.serve = map[string]bool{}
		for _, name := range cfg.Serve {
			if _, ok := d.laneByName[name]; !ok {
				return nil, fmt.Errorf("dispatch config: serve lists unknown lane %q", name)
			}
			d.serve[name] = true
		}
		if len(d.serve) == 0 {
			return nil, errors.New("dispatch config: serve lists no lane")
		}
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

func setDefault[T int | time.Duration](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
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

// loop claims and starts work until the job is finished (nil) or loopCtx
// ends (its cause).
func (d *Dispatcher) loop(loopCtx, workCtx, storeCtx context.Context) error {
	// Counting is a scan in a big store, so an idle loop (everything in
	// retry backoff, or every endpoint down) counts less and less often.
	var lastCheck time.Time
	checkGap := minPoll
	start := 0
	timer := time.NewTimer(maxPoll)
	defer timer.Stop()
	ingestDone := d.cfg.IngestDone
	for {
		if loopCtx.Err() != nil {
			return context.Cause(loopCtx)
		}
		started, again, err := d.claimRound(loopCtx, workCtx, storeCtx, start)
		if err != nil {
			return err
		}
		start++ // rotate which lane claims first, for fairness between lanes
		if again {
			continue
		}
		now := d.now()
		d.mu.Lock()
		idle := d.inflight == 0
		d.mu.Unlock()
		if started > 0 {
			checkGap = minPoll
		}
		if started == 0 && idle && (lastCheck.IsZero() || now.Sub(lastCheck) >= checkGap) {
			lastCheck = now
			checkGap = min(2*checkGap, maxCheckGap)
			finished, err := d.finished(loopCtx, storeCtx)
			if err != nil {
				return err
			}
			if finished {
				d.log.Info("no work left")
				return nil
			}
		}
		wait := d.nextWake(now, idle, lastCheck.Add(checkGap))
		timer.Reset(wait)
		select {
		case <-loopCtx.Done():
		case <-d.wake:
		case <-timer.C:
		case <-ingestDone:
			// Everything is in: the next idle pass may end Run.
			ingestDone, lastCheck, checkGap = nil, time.Time{}, minPoll
		}
		if !timer.Stop() {
			select { // drain a fire that raced with another case
			case <-timer.C:
			default:
			}
		}
	}
}

// nextWake is how long the loop may sleep before something it waits for can
// have happened: a short lane's next poll, a breaker turning half-open, or
// the next finished check when idle.
func (d *Dispatcher) nextWake(now time.Time, idle bool, nextCheck time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	next := now.Add(maxPoll)
	if idle {
		next = earliest(next, nextCheck)
	}
	for _, l := range d.lanes {
		if free, _ := d.laneRoomLocked(l, now); l.short && free > 0 {
			next = earliest(next, l.nextPoll)
		}
	}
	if until, hold := d.startHoldLocked(now); hold {
		next = earliest(next, until)
	}
	for _, e := range d.eps {
		if !e.paused && !e.breakerClosed() && now.Before(e.openUntil) {
			next = earliest(next, e.openUntil)
		}
		if !e.paused && now.Before(e.holdUntil) {
			next = earliest(next, e.holdUntil)
		}
	}
	return max(next.Sub(now), time.Millisecond)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// claimRound claims work for every lane with free slots while an endpoint can
// take it. again reports that some lane got all it asked for and still has
// room, so another round should follow at once.
func (d *Dispatcher) claimRound(loopCtx, workCtx, storeCtx context.Context, start int) (started int, again bool, err error) {
	d.mu.Lock()
	_, hold := d.startHoldLocked(d.now())
	d.mu.Unlock()
	if hold {
		return 0, false, nil
	}
	for i := range d.lanes {
		l := d.lanes[(start+i)%len(d.lanes)]
		if !d.serves(l.cfg.Name) {
			continue
		}
		now := d.now()
		d.mu.Lock()
		free, capacity := d.laneRoomLocked(l, now)
		skip := free == 0 || (l.short && now.Before(l.nextPoll))
		d.mu.Unlock()
		if capacity == 0 {
			return started, false, nil
		}
		if skip {
			continue
		}
		if err := d.reconcile(loopCtx, storeCtx); err != nil {
			return started, false, err
		}
		n := min(free, capacity, maxClaim)
		// The guard's count and the requests in flight are read together
		// under d.mu: a settle records a refusal before it retires the
		// sample (under d.mu), so no pair read here counts the sample in
		// neither.
		d.mu.Lock()
		b, guarded := d.guard.budget()
		if guarded {
			n = min(n, b-d.inflight)
		}
		d.mu.Unlock()
		if guarded && n <= 0 {
			continue
		}
		claimed, err := d.claim(loopCtx, storeCtx, l, n, guarded)
		if err != nil {
			return started, false, err
		}
		d.mu.Lock()
		for _, c := range claimed {
			d.held[c.ID] = c.Token
		}
		if len(claimed) < n {
			d.moveQueuedLocked(l, now)
			l.short = true
			l.nextPoll = now.Add(l.backoff)
			l.backoff = min(2*l.backoff, maxPoll)
		} else {
			l.short = false
		}
		if len(claimed) > 0 {
			l.backoff = minPoll
		}
		d.mu.Unlock()
		started += d.startAll(workCtx, storeCtx, l, claimed)
		d.mu.Lock()
		free, _ = d.laneRoomLocked(l, d.now())
		d.mu.Unlock()
		if len(claimed) == n && free > 0 {
			again = true
		}
	}
	return started, again, nil
}

// claim leases up to n samples of lane l. While the poison guard is armed
// (guarded), the samples it counted went back to pending unspent and would
// come first again: it asks for that many more and gives them back, and
// when nothing else is left to try it trips the guard with what it has.
func (d *Dispatcher) claim(loopCtx, storeCtx context.Context, l *lane, n int, guarded bool) ([]store.Claimed, error) {
	extra := 0
	if guarded {
		extra = d.guard.streak()
	}
	var claimed []store.Claimed
	err := d.storeDo(storeCtx, loopCtx.Done(), func(ctx context.Context) error {
		var err error
		claimed, err = d.cfg.Store.Claim(ctx, l.cfg.Name, n+extra, d.cfg.Owner, d.cfg.Lease)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", l.cfg.Name, err)
	}
	if extra == 0 {
		return claimed, nil
	}
	var fresh []store.Claimed
	var again []string
	for _, c := range claimed {
		if d.guard.refused(c.ID) {
			again = append(again, c.ID)
		} else if len(fresh) < n {
			fresh = append(fresh, c)
		} else {
			again = append(again, c.ID)
		}
	}
	if len(again) > 0 {
		err := d.storeDo(storeCtx, nil, func(ctx context.Context) error { return d.cfg.Store.Release(ctx, again, d.cfg.Owner) })
		if err != nil && !errors.Is(err, store.ErrNotLeased) {
			d.log.Warn("refused samples not released", "samples", len(again), "err", err)
		}
	}
	d.mu.Lock()
	idle := d.inflight == 0
	d.mu.Unlock()
	if len(fresh) == 0 && len(again) > 0 && idle && d.ingestDone() {
		d.guard.exhausted(d)
	}
	return fresh, nil
}

// reconcile runs before the next claim after any store call failed: a
// claim may have committed with its reply lost, or a database crash may have
// undone a release committed without waiting for the disk. Every sample
// leased to this owner that it does not hold goes back to pending (no
// attempt spent); leases extended every Lease/3 would otherwise keep such
// samples from everyone for good.
func (d *Dispatcher) reconcile(loopCtx, storeCtx context.Context) error {
	d.mu.Lock()
	if d.unsure == d.reconciled {
		d.mu.Unlock()
		return nil
	}
	gen := d.unsure
	keep := make([]string, 0, len(d.held))
	for id := range d.held {
		keep = append(keep, id)
	}
	d.mu.Unlock()
	var n int
	err := d.storeDo(storeCtx, loopCtx.Done(), func(ctx context.Context) error {
		var err error
		n, err = d.cfg.Store.ReleaseOwnerExcept(ctx, d.cfg.Owner, keep)
		return err
	})
	if err != nil {
		return fmt.Errorf("release samples of a lost claim: %w", err)
	}
	d.mu.Lock()
	d.reconciled = max(d.reconciled, gen) // failures since gen need another pass
	d.counters.Released += int64(n)
	d.mu.Unlock()
	if n > 0 {
		d.log.Warn("released samples leased to this worker that it does not hold (a lost claim reply or an undone release)", "samples", n)
	}
	return nil
}

// startAll starts a worker per claimed sample. Samples that cannot start
// after all (the limit shrank, or every endpoint was paused since the claim)
// are released at once: no lease is held for work that is not running.
func (d *Dispatcher) startAll(workCtx, storeCtx context.Context, l *lane, claimed []store.Claimed) int {
	var unstarted []string
	started := 0
	for _, c := range claimed {
		if l.auto == nil && !l.lim.TryAcquire() {
			unstarted = append(unstarted, c.ID)
			continue
		}
		var aff affinity
		if !d.cfg.NoAffinity {
			aff = affinityOf(c)
		}
		now := d.now()
		d.mu.Lock()
		est := d.estimateLocked(l, c)
		e, probe := d.pickLocked(now, l, est, aff)
		if e == nil {
			d.mu.Unlock()
			if l.auto == nil {
				l.lim.Release()
			}
			unstarted = append(unstarted, c.ID)
			continue
		}
		reqCtx, cancel := context.WithCancelCause(workCtx)
		cl := &call{ep: e, probe: probe, cancel: cancel, lane: l, start: now, est: est, prompt: float64(max(c.PromptTokens, 0))}
		d.acquireLocked(cl, now)
		d.inflight++
		d.mu.Unlock()
		started++
		d.workers.Add(1)
		go func() {
			defer d.workers.Done()
			d.work(workCtx, reqCtx, storeCtx, cl, l, c)
		}()
	}
	if len(unstarted) > 0 {
		err := d.storeDo(storeCtx, nil, func(ctx context.Context) error {
			return d.cfg.Store.Release(ctx, unstarted, d.cfg.Owner)
		})
		if err != nil && !errors.Is(err, store.ErrNotLeased) {
			// Only an aborted drain gives up on the store; the leases expire.
			d.log.Warn("unstarted samples not released", "samples", len(unstarted), "err", err)
		}
		d.mu.Lock()
		d.counters.Released += int64(len(unstarted))
		l.short = false
		for _, id := range unstarted {
			delete(d.held, id)
		}
		d.mu.Unlock()
	}
	return started
}

// work sends one sample's current turn and records the outcome.
func (d *Dispatcher) work(workCtx, reqCtx, storeCtx context.Context, cl *call, l *lane, c store.Claimed) {
	e := cl.ep
	t, err := d.prepareTurn(c)
	if err != nil {
		cl.cancel(nil)
		d.settle(storeCtx, cl, l, c, nil, llm.Result{}, &llm.Error{Class: llm.BadRequest, Msg: "build request: " + err.Error()}, nil)
		return
	}
	if why := d.tooLong(c, t); why != "" {
		cl.cancel(nil)
		d.settle(storeCtx, cl, l, c, nil, llm.Result{}, &llm.Error{Class: llm.BadRequest, Msg: why}, nil)
		return
	}
	hedgeAt, hedgeStep := d.hedgeChunks(l, e)
	res, err, cause := d.send(reqCtx, cl, t, func(chunks int64) {
		if hedgeAt > 0 && chunks >= hedgeAt {
			hedgeAt += hedgeStep
			if d.tryHedge(workCtx, cl, l, t) {
				hedgeAt = 0
			}
		}
	})
	d.mu.Lock()
	h := cl.hedge
	d.mu.Unlock()
	if h != nil {
		if err == nil && res.FinishReason == "length" {
			d.settleFromHedge(storeCtx, cl, l, c, t, res, h)
			return
		}
		// The first answer decides the sample: the backup is not needed.
		h.cl.cancel(errHedgeDropped)
		<-h.done
	}
	d.settle(storeCtx, cl, l, c, t, res, err, cause)
}

// send streams t's request for call cl in its lane, marks every chunk on
// the call and its endpoint (onChunk, when not nil, then sees the chunks so
// far), and reports the finished request to Observe. cause is why ctx
// ended, when the request failed.
func (d *Dispatcher) send(ctx context.Context, cl *call, t *turn, onChunk func(chunks int64)) (res llm.Result, err, cause error) {
	e, l := cl.ep, cl.lane
	req := llm.Request{Model: d.cfg.Model, Body: t.body, MaxTokens: l.cfg.MaxTokens, Params: d.cfg.Params}
	start := d.now()
	res, err = e.client.Chat(ctx, req, func(tokens int) {
		cl.streaming.Store(true)
		n := cl.generated.Add(int64(tokens))
		d.guard.accepted()
		e.lastToken.Store(d.now().UnixNano())
		e.tokens.Add(int64(tokens))
		if onChunk != nil {
			onChunk(n)
		}
	})
	if err != nil {
		cause = context.Cause(ctx)
	} else {
		d.guard.accepted()
		e.completion.Add(int64(res.Usage.CompletionTokens))
	}
	cl.cancel(nil)
	d.observe(l.cfg.Name, e.url, start, res, err, cause)
	return res, err, cause
}

// storeDo runs op until it succeeds or reports ErrNotLeased or
// ErrWrongTurn (final, returned at once). Any other error is retried with backoff for as long as it
// lasts, and the store is reported down meanwhile (Snapshot().Store): a
// result waits here, in memory, instead of being lost or stopping the run.
// It gives up only when stop is closed or the drain is aborted, returning
// the last error.
func (d *Dispatcher) storeDo(ctx context.Context, stop <-chan struct{}, op func(context.Context) error) error {
	gap := storeRetryGap
	failing := false
	for {
		err := op(ctx)
		if err == nil || errors.Is(err, store.ErrNotLeased) || errors.Is(err, store.ErrWrongTurn) {
			if failing {
				d.storeRecovered(true)
			}
			return err
		}
		d.storeFailed(err, !failing)
		failing = true
		t := time.NewTimer(gap/2 + rand.N(gap/2+1)) // jitter: workers do not retry in step
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			d.storeRecovered(false)
			return err
		case <-d.aborted:
			t.Stop()
			d.storeRecovered(false)
			return err
		}
		gap = min(2*gap, maxStoreRetryGap)
	}
}

// storeFailed records a failed store call; first marks the first failure of
// a call. The store is down while any call keeps failing; the first
// failure of an outage is logged.
func (d *Dispatcher) storeFailed(err error, first bool) {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &d.storeSt
	st.Failures++
	st.LastError = err.Error()
	d.unsure++
	if first {
		d.storeRetrying++
	}
	if !st.Down {
		st.Down, st.Since = true, now
		st.Outages++
		d.log.Warn("store down; retrying with backoff, results kept in memory", "err", err)
	}
}

// storeRecovered ends one call's failures; the outage ends with the last.
// Only a call that succeeded (ok) says the store is back: one that gave up
// (a drain that ended) does not know.
func (d *Dispatcher) storeRecovered(ok bool) {
	d.mu.Lock()
	d.storeRetrying--
	st := &d.storeSt
	if d.storeRetrying > 0 || !st.Down {
		d.mu.Unlock()
		return
	}
	down := d.now().Sub(st.Since)
	st.Down, st.Since = false, time.Time{}
	st.LastOutage = down
	d.mu.Unlock()
	if ok {
		d.log.Warn("store back", "down_for", down.Round(time.Millisecond))
	}
	select {
	case d.storeBack <- struct{}{}:
	default:
	}
}

// ingestDone reports whether every sample of the job is in the store: until
// then a short claim means "not yet", not "no more".
func (d *Dispatcher) ingestDone() bool {
	if d.cfg.IngestDone == nil {
		return true
	}
	select {
	case <-d.cfg.IngestDone:
		return true
	default:
		return false
	}
}

// finished reports whether no sample of a configured lane is pending or
// leased. Pending samples in a lane this dispatcher does not serve would
// never finish, so they are an error.
func (d *Dispatcher) finished(loopCtx, storeCtx context.Context) (bool, error) {
	if !d.ingestDone() {
		return false, nil // samples are still arriving
	}
	var counts []store.Count
	err := d.storeDo(storeCtx, loopCtx.Done(), func(ctx context.Context) error {
		var err error
		counts, err = d.cfg.Store.Counts(ctx)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("count samples: %w", err)
	}
	for _, c := range counts {
		if c.N == 0 || (c.State != store.Pending && c.State != store.Leased) {
			continue
		}
		if _, ok := d.laneByName[c.Lane]; !ok {
			if c.State == store.Pending {
				return false, fmt.Errorf("lane %q has %d pending samples but is not configured", c.Lane, c.N)
			}
			continue
		}
		if !d.serves(c.Lane) {
			continue // another worker's lane
		}
		return false, nil
	}
	return true, nil
}

// maintain extends this owner's leases every Lease/3 and returns expired
// leases of dead owners to pending.
func (d *Dispatcher) maintain(ctx, storeCtx context.Context) {
	t := time.NewTicker(max(d.cfg.Lease/3, time.Millisecond))
	defer t.Stop()
	d.expire(storeCtx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.storeBack:
		}
		if err := d.cfg.Store.ExtendLeases(storeCtx, d.cfg.Owner, d.cfg.Lease); err != nil {
			d.log.Warn("extend leases", "err", err)
		}
		d.expire(storeCtx)
	}
}

func (d *Dispatcher) expire(storeCtx context.Context) {
	n, err := d.cfg.Store.ExpireLeases(storeCtx, d.now())
	if err != nil {
		d.log.Warn("expire leases", "err", err)
		return
	}
	if n == 0 {
		return
	}
	d.log.Info("expired leases returned to pending", "samples", n)
	d.mu.Lock()
	for _, l := range d.lanes {
		l.short = false
	}
	d.mu.Unlock()
	d.signal()
}

// Pause stops sending to the endpoint at url (the supervisor saw it go down
// or stall): its in-flight requests are cancelled and their samples released
// without spending attempts. Unknown URLs are ignored.
func (d *Dispatcher) Pause(url, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.epByURL[url]
	if !ok {
		d.log.Warn("pause of unknown endpoint", "endpoint", url)
		return
	}
	if !e.paused {
		d.log.Info("endpoint paused", "endpoint", url, "reason", reason, "in_flight", e.inflight)
	}
	e.paused = true
	e.pausedAt = d.now()
	e.pauseReason = reason
	// Its next interval starts when it is back: a down server's probes
	// fail, and what its requests saw before (errors, TTFT) is not the
	// restarted server's.
	e.load.obsAt, e.load.errs, e.load.ttftSum, e.load.ttftN = time.Time{}, 0, 0, 0
	for c := range e.calls {
		c.cancel(errPaused)
	}
}

// Resume sends to the endpoint at url again (the supervisor saw it ready)
// and closes its breaker.
func (d *Dispatcher) Resume(url string) {
	d.mu.Lock()
	e, ok := d.epByURL[url]
	if !ok {
		d.mu.Unlock()
		d.log.Warn("resume of unknown endpoint", "endpoint", url)
		return
	}
	if e.paused {
		d.log.Info("endpoint resumed", "endpoint", url)
	}
	e.paused = false
	e.pauseReason = ""
	e.resumed = true
	if d.firstResume.IsZero() {
		d.firstResume = d.now()
	}
	e.closeBreaker() // the supervisor saw it ready: no probe needed
	d.mu.Unlock()
	d.signal()
}

// SetLaneLimit changes a lane's concurrency limit while running (for an
// adaptive limiter). Lowering it cancels nothing; new requests wait until
// enough finish.
func (d *Dispatcher) SetLaneLimit(name string, n int) error {
	l, ok := d.laneByName[name]
	if !ok {
		return fmt.Errorf("set lane limit: unknown lane %q", name)
	}
	if l.auto != nil {
		return fmt.Errorf("set lane limit: lane %q has an adaptive limit", name)
	}
	l.lim.SetLimit(n)
	d.signal()
	return nil
}

// Snapshot returns a copy of the live state.
func (d *Dispatcher) Snapshot() Snapshot {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	s := Snapshot{StartedAt: d.startedAt, Counters: d.counters, Store: d.storeSt}
	for _, e := range d.eps {
		s.Endpoints = append(s.Endpoints, d.endpointStatsLocked(e, now))
	}
	s.Lanes = d.laneStatsLocked(now)
	return s
}
