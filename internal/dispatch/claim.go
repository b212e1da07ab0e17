package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

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
