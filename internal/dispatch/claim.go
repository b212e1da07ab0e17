package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
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
		d.mu.Lock()
		broken := d.brokenLocked(d.now())
		d.mu.Unlock()
		if broken != nil {
			d.fatal(broken)
			return broken
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
				d.log.Info("no work left", "next_turns", d.nextTurns.Load(), "from_kept_history", d.historyReused.Load(), "claimed_kept", d.keptClaims.Load())
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
		n, more, stop, err := d.claimLane(loopCtx, workCtx, storeCtx, l)
		started += n
		again = again || more
		if err != nil || stop {
			return started, false, err
		}
	}
	return started, again, nil
}

// claimLane claims work for lane l if it has free slots and starts it with
// the samples it kept (backlog.go). more reports that it got all it asked
// for and still has room; stop that no endpoint takes work at all.
func (d *Dispatcher) claimLane(loopCtx, workCtx, storeCtx context.Context, l *lane) (started int, more, stop bool, err error) {
	now := d.now()
	d.mu.Lock()
	free, capacity := d.laneRoomLocked(l, now)
	short := l.short && now.Before(l.nextPoll)
	keep, kept := d.backlogCapLocked(l), len(l.backlog)
	d.mu.Unlock()
	if capacity == 0 {
		d.releaseBacklog(storeCtx) // no lease is held for work nobody takes
		return 0, false, true, nil
	}
	if free == 0 || (short && kept == 0) {
		return 0, false, false, nil
	}
	if err := d.reconcile(loopCtx, storeCtx); err != nil {
		return 0, false, false, err
	}
	n := min(free, capacity, maxClaim)
	if keep > 0 {
		n = min(max(free+keep-kept, 0), maxClaim)
	}
	if short {
		n = 0 // the store had no more: only the kept samples start
	}
	// The guard's count and the requests in flight are read together
	// under d.mu: a settle records a refusal before it retires the
	// sample (under d.mu), so no pair read here counts the sample in
	// neither.
	d.mu.Lock()
	b, guarded := d.guard.budget()
	if guarded {
		n, keep = min(n, b-d.inflight), 0
	}
	d.expireLocked(now)
	n = d.claimCapLocked(l, n)
	n = d.chainCapLocked(l, n)
	seq := d.claimStartLocked()
	d.mu.Unlock()
	if guarded {
		// Kept samples would hide from the guard's claim what is left to try.
		d.releaseBacklog(storeCtx)
		if n <= 0 {
			return 0, false, false, nil
		}
	}
	var claimed []store.Claimed
	if n > 0 {
		if claimed, err = d.claim(loopCtx, storeCtx, l, n, guarded); err != nil {
			return 0, false, false, err
		}
		d.noteClaimed(l, claimed, n, now, kept == 0)
		if !guarded { // a guarded claim gives some back: it says nothing of what was waiting
			d.mu.Lock()
			d.dropTakenLocked(l, seq, claimed, n)
			d.mu.Unlock()
		}
	}
	started = d.startAll(loopCtx, workCtx, storeCtx, l, claimed, keep)
	d.mu.Lock()
	free, _ = d.laneRoomLocked(l, d.now())
	// While admission holds first turns back, the next claim waits for a
	// settle (a next turn pending) rather than asking again at once; so
	// does a claim that started nothing although an endpoint had room:
	// its samples wait for another (next turns pinned to their full
	// endpoint, pinnedLocked), and the store hands the same ones out
	// first again, so claiming at once would claim and release them in a
	// loop while the endpoint with room idles.
	blocked := l.admBlocked || started == 0
	d.mu.Unlock()
	return started, n > 0 && len(claimed) == n && free > 0 && !blocked, false, nil
}

// noteClaimed records the samples claimed for lane l (n asked for) and
// whether the store had no more; at the end of the lane (and with none
// kept, moveable) requests queued at a busy server may move to an idle one.
func (d *Dispatcher) noteClaimed(l *lane, claimed []store.Claimed, n int, now time.Time, moveable bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range claimed {
		d.held[c.ID] = c.Token
	}
	d.noteChainClaimLocked(l, n, len(claimed))
	if len(claimed) < n && l.cfg.EscalateTo != "" && !l.short {
		d.signal() // the lane it escalates to may hold escalations for this moment (chains.go)
	}
	if len(claimed) < n {
		if moveable {
			d.moveQueuedLocked(l, now)
		}
		l.short, l.emptyAt = true, now
		l.nextPoll = now.Add(l.backoff)
		l.backoff = min(2*l.backoff, maxPoll)
	} else {
		l.short, l.fullAt = false, now
	}
	if len(claimed) > 0 {
		l.backoff = minPoll
	}
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
	kept := d.keptFor(l, n+extra)
	err := d.storeDo(storeCtx, loopCtx.Done(), func(ctx context.Context) error {
		var err error
		if len(kept) > 0 {
			claimed, err = d.cfg.Store.ClaimKept(ctx, l.cfg.Name, n+extra, d.cfg.Owner, d.cfg.Lease, kept)
		} else {
			claimed, err = d.cfg.Store.Claim(ctx, l.cfg.Name, n+extra, d.cfg.Owner, d.cfg.Lease)
		}
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

// startAll starts a worker per claimed sample, after the samples lane l
// kept from earlier claims (backlog.go): first those whose home has room
// or that have none, then, while any endpoint has room, the others. Up to
// keep samples that found no room stay claimed for the next round; the
// rest (the limit shrank, or every endpoint was paused since the claim)
// are released at once: no lease is held for work that waits otherwise.
// A turn handed over Kept waits for the commit of its history's answer
// (convHistory.storedAnswer) until loopCtx ends.
func (d *Dispatcher) startAll(loopCtx, workCtx, storeCtx context.Context, l *lane, claimed []store.Claimed, keep int) int {
	fresh := make([]waiting, len(claimed))
	d.mu.Lock()
	for i, c := range claimed {
		fresh[i].c = c
		if h := d.adm.byID[c.ID]; h != nil {
			fresh[i].hist = h.hist
		}
	}
	d.mu.Unlock()
	var lost []string
	for i, c := range claimed {
		w := &fresh[i]
		if !w.hist.fits(c) || (c.Kept && !w.hist.storedAnswer(loopCtx)) {
			w.hist = nil
		}
		if c.Turn > 0 {
			d.nextTurns.Add(1)
		}
		if c.Kept && w.hist != nil {
			d.keptClaims.Add(1)
		}
		switch {
		case c.Kept && w.hist == nil:
			// Handed over for a history dropped since the claim named it
			// (the hold expired) or whose answer another attempt of its
			// turn stored first: back to the store, whole next time.
			lost = append(lost, c.ID)
		case w.hist != nil:
			w.c.Body = w.hist.sample // the store's, which it did not read again
			if !d.cfg.NoAffinity {
				w.a = w.hist.affinity(c)
			}
		default:
			// One walk of the body for the affinity and the request (a body
			// that does not decode is dead-lettered when its turn is built).
			if p, err := conversation.DecodeStored(c.Body); err == nil {
				w.plan = p
				if !d.cfg.NoAffinity {
					w.a = affinityFrom(c, p.Shape())
				}
			} else if !d.cfg.NoAffinity {
				w.a = affinityOf(c)
			}
		}
		w.a.admitted = w.a.newConv && !d.cfg.NoAffinity && !d.cfg.NoAdmission
	}
	if len(lost) > 0 {
		fresh = slices.DeleteFunc(fresh, func(w waiting) bool { return w.c.Kept && w.hist == nil })
		d.releaseUnstarted(storeCtx, lost)
	}
	d.mu.Lock()
	queue := queueLocked(l, fresh)
	d.mu.Unlock()
	started := 0
	unstarted := d.sendQueue(l, queue, keep, func(w waiting) bool {
		if d.startOne(workCtx, storeCtx, l, w) {
			started++
			return true
		}
		return false
	})
	d.mu.Lock()
	n := min(keep, len(unstarted))
	l.backlog = append(l.backlog, unstarted[:n]...)
	d.mu.Unlock()
	var ids []string
	for _, w := range unstarted[n:] {
		ids = append(ids, w.c.ID)
	}
	d.releaseUnstarted(storeCtx, ids)
	return started
}

// startOne starts a worker for w on the endpoint pickLocked chooses and
// reports whether it did (false: no endpoint has room for it now).
func (d *Dispatcher) startOne(workCtx, storeCtx context.Context, l *lane, w waiting) bool {
	if l.auto == nil && !l.lim.TryAcquire() {
		return false
	}
	c := w.c
	now := d.now()
	d.mu.Lock()
	if w.a.newConv && l.admBlocked && !d.cfg.NoAdmission {
		// No endpoint admitted a new conversation since the last one left.
		d.mu.Unlock()
		if l.auto == nil {
			l.lim.Release()
		}
		return false
	}
	est := d.estimateLocked(l, c)
	e, probe := d.pickLocked(now, l, est, w.a)
	if e == nil {
		d.mu.Unlock()
		if l.auto == nil {
			l.lim.Release()
		}
		return false
	}
	reqCtx, cancel := context.WithCancelCause(workCtx)
	cl := &call{ep: e, probe: probe, cancel: cancel, lane: l, start: now, est: est, prompt: float64(max(c.PromptTokens, 0)), later: w.a.conv && c.Turn > 0}
	if w.a.conv {
		cl.routingKey = c.ID
	}
	cl.held = d.holdLocked(c.ID, e, est, w.a)
	cl.hist, cl.plan = w.hist, w.plan
	d.acquireLocked(cl, now)
	d.inflight++
	d.mu.Unlock()
	d.workers.Add(1)
	go func() {
		defer d.workers.Done()
		d.work(workCtx, reqCtx, storeCtx, cl, l, c)
	}()
	return true
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
