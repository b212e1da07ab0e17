package dispatch

import (
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/store"
)

// Token-aware balancing. A request is sent to the available endpoint whose
// KV pool would be least full after it, counting every request in flight
// there at its estimated footprint: the prompt estimate plus the lane's mean
// completion so far. Two servers whose pools differ by two get work in that
// ratio, whatever their request counts. Until every candidate's pool is
// known (a probe reported it, or the job file gave it), the request goes to
// the candidate with the fewest requests in flight, as before.

// defaultOutputGuess is the completion length assumed for a lane before any
// of its requests finished (or its max_tokens, when smaller).
const defaultOutputGuess = 1024

// estimateLocked is the token footprint expected of c in lane l.
func (d *Dispatcher) estimateLocked(l *lane, c store.Claimed) float64 {
	return float64(max(c.PromptTokens, 0)) + d.meanOutputLocked(l)
}

// meanOutputLocked is the completion length expected of a request of l:
// the mean seen so far, or a guess before any answer.
func (d *Dispatcher) meanOutputLocked(l *lane) float64 {
	if l.outN > 0 {
		return l.outSum / float64(l.outN)
	}
	if l.cfg.MaxTokens > 0 {
		return min(defaultOutputGuess, float64(l.cfg.MaxTokens))
	}
	return defaultOutputGuess
}

// roomLocked is how many more requests of lane l endpoint e takes now: its
// breaker's allowance, and for an auto lane what its limit and the
// endpoint's crash ceiling leave.
func (e *endpoint) roomLocked(l *lane, now time.Time) int {
	n := e.capacity(now)
	if n > 0 && l.auto == nil && e.fixedCap > 0 {
		return min(n, max(e.fixedCap-e.fixedInflightLocked(), 0))
	}
	if n == 0 || l.auto == nil {
		return n
	}
	el := e.lanes[l.idx]
	n = min(n, max(el.ctl.Limit()-el.inflight, 0))
	if e.ceiling > 0 {
		n = min(n, max(e.ceiling-e.inflight, 0))
	}
	return n
}

// laneRoomLocked is lane l's room: free slots (the lane's limiter for a
// fixed lane, the sum over endpoints for an auto lane) and how many requests
// the endpoints' breakers accept at all.
func (d *Dispatcher) laneRoomLocked(l *lane, now time.Time) (free, accept int) {
	for _, e := range d.eps {
		accept += e.capacity(now)
		if l.auto != nil {
			free += e.roomLocked(l, now)
		}
	}
	if l.auto == nil {
		room := 0
		for _, e := range d.eps {
			room += e.roomLocked(l, now)
		}
		free = min(l.lim.Free(), room)
	}
	return free, accept
}

// fixedInflightLocked counts e's requests of fixed lanes.
func (e *endpoint) fixedInflightLocked() int {
	n := 0
	for _, el := range e.lanes {
		if el.ctl == nil {
			n += el.inflight
		}
	}
	return n
}

// pickLocked chooses the endpoint for a request of lane l with footprint est
// and affinity a: among available endpoints with room for the lane, the
// affinity rule's choice (affinity.go; with affinity off, or none asked,
// the one whose pool would be least full after it, or, while some pool is
// unknown, the one with the fewest requests in flight), ties broken round
// robin. probe reports that the request is the single one a half-open
// breaker lets through.
func (d *Dispatcher) pickLocked(now time.Time, l *lane, est float64, a affinity) (e *endpoint, probe bool) {
	n := len(d.eps)
	eps, cands, byTokens := d.candidatesLocked(now, l, est, a, true)
	i, kept := chooseKept(cands, a, byTokens)
	if i < 0 {
		d.refusedLocked(l, now, a)
		return nil, false
	}
	best := eps[i]
	best.noteSentLocked(l.idx, kept)
	// Sent back over its limit (returnRoomLocked): acquireLocked counts it.
	best.lanes[l.idx].overNext = best.roomLocked(l, now) == 0
	d.rr = (d.rr + 1) % n
	if !best.breakerClosed() {
		best.probing = true
		return best, true
	}
	return best, false
}

// candidatesLocked lists the endpoints a request of lane l with footprint
// est and affinity a may go to, in round-robin order, with their loads as
// the affinity rule sees them, and whether the loads are pool fills
// (byTokens) or requests in flight. inLimits keeps only those with room for
// the lane (or the return allowance of a's previous endpoint) that admit
// the request (admit.go); otherwise every available endpoint is listed
// (homeLocked). A held conversation's next turn lists only its endpoint
// (pinnedLocked).
func (d *Dispatcher) candidatesLocked(now time.Time, l *lane, est float64, a affinity, inLimits bool) ([]*endpoint, []candidate, bool) {
	n := len(d.eps)
	pin := d.pinnedLocked(a)
	fits := func(c *endpoint) bool {
		if pin != nil && c != pin {
			return false
		}
		if !inLimits {
			return c.capacity(now) > 0
		}
		if !d.admitsLocked(c, est, a) {
			return false
		}
		return c.roomLocked(l, now) > 0 || (a.prev == c.url && c.returnRoomLocked(l, now))
	}
	byTokens := true
	for _, c := range d.eps {
		counted := c.capacity(now) > 0
		if inLimits {
			counted = c.roomLocked(l, now) > 0
		}
		if counted && c.load.capacity <= 0 {
			byTokens = false
		}
	}
	eps := make([]*endpoint, 0, n)
	cands := make([]candidate, 0, n)
	for i := range n {
		c := d.eps[(d.rr+i)%n]
		if !fits(c) {
			continue
		}
		score := float64(c.inflight)
		if byTokens {
			score = (c.load.committed + est) / c.load.capacity
		}
		eps = append(eps, c)
		cands = append(cands, candidate{url: c.url, load: score, closed: c.breakerClosed()})
	}
	return eps, cands, byTokens
}

// acquireLocked registers a started request with its endpoint and counts
// it there and in its lane; releaseLocked undoes it.
func (d *Dispatcher) acquireLocked(cl *call, now time.Time) {
	e := cl.ep
	e.calls[cl] = struct{}{}
	cl.tokens0 = e.tokens.Load()
	if e.inflight == 0 {
		e.busySince = now
	}
	e.inflight++
	e.requests++
	e.load.peak = max(e.load.peak, e.inflight)
	el := &e.lanes[cl.lane.idx]
	if el.overNext {
		cl.over = true
		el.over++
		el.overNext = false
	}
	el.inflight++
	el.peak = max(el.peak, el.inflight)
	e.load.committed += cl.est
}

// releaseLocked takes a finished request off its endpoint and records what
// the adaptive limits and the estimates learn from it.
// overloaded counts a retryable error (429, a 5xx from a live server):
// the server answered, and said no.
func (d *Dispatcher) releaseLocked(cl *call, ttft time.Duration, completion int, overloaded bool) {
	e, l := cl.ep, cl.lane
	delete(e.calls, cl)
	e.inflight--
	e.lanes[l.idx].inflight--
	if cl.over {
		e.lanes[l.idx].over--
	}
	e.load.committed = max(e.load.committed-cl.est, 0)
	if ttft > 0 {
		e.load.ttftSum += ttft
		e.load.ttftN++
	}
	if overloaded {
		e.load.errs++
	}
	e.learnChunkLocked(completion, cl.generated.Load())
	if completion > 0 {
		l.outSum += float64(completion)
		l.outN++
	}
}

// moveQueuedLocked is the end of a lane's work: the store has no more of
// it, so what still waits in a server's queue is all that is left to
// balance. An available endpoint whose queue was empty at its last probe
// takes over requests waiting elsewhere, as many as its free KV pool holds
// at the lane's footprint and its limits allow, once per probe: of the
// other server's requests without a first token, the most recently sent
// (it serves in arrival order), as many as its queue holds, are cancelled
// before they generated anything and released without spending an
// attempt, and the next claim sends each to the endpoint whose pool is
// least full.
func (d *Dispatcher) moveQueuedLocked(l *lane, now time.Time) {
	for _, thief := range d.eps {
		room := min(thief.roomLocked(l, now), thief.freeSlotsLocked(l))
		if room <= 0 || !thief.breakerClosed() || thief.queuedLocked() != 0 || !thief.load.movedAt.Before(thief.load.metricsAt) {
			continue
		}
		for _, victim := range d.eps {
			if victim == thief || room == 0 {
				continue
			}
			moved := 0
			for _, cl := range victim.waitingCallsLocked(l) {
				if room == 0 {
					break
				}
				cl.moved = true
				cl.cancel(errMoved)
				room--
				moved++
			}
			if moved > 0 {
				thief.load.movedAt = thief.load.metricsAt
				d.counters.Moved += int64(moved)
				d.log.Info("queued requests moved", "lane", l.cfg.Name, "from", victim.url, "to", thief.url, "requests", moved)
			}
		}
	}
}

// freeSlotsLocked is how many requests of lane l the free part of e's KV
// pool holds at the lane's mean footprint, at its last probe; 0 when its
// pool or usage is unknown.
func (e *endpoint) freeSlotsLocked(l *lane) int {
	m := e.load.metrics
	if e.load.capacity <= 0 || !m.Present.Has(engine.FieldTokenUsage) || l.outN == 0 {
		return 0
	}
	per := l.outSum/float64(l.outN) + 1000 // a prompt of about a thousand tokens
	return int((1 - m.TokenUsage) * e.load.capacity / per)
}

// queuedLocked is the server's queue at its last probe, -1 when unknown.
func (e *endpoint) queuedLocked() float64 {
	if e.load.metricsAt.IsZero() || !e.load.metrics.Present.Has(engine.FieldQueued) {
		return -1
	}
	return e.load.metrics.Queued
}

// waitingCallsLocked lists e's requests of lane l that wait in the
// server's queue: of those without a first token, the most recently sent,
// as many as the server's queue holds at its last probe.
func (e *endpoint) waitingCallsLocked(l *lane) []*call {
	q := int(e.queuedLocked())
	if q <= 0 {
		return nil
	}
	var out []*call
	for cl := range e.calls {
		if !cl.streaming.Load() {
			out = append(out, cl)
		}
	}
	// A backup is counted among the server's queue but is not moved: its
	// sample has a request running already. Requests already cancelled
	// (moved or shed) still fill the queue until they are released, so
	// they are dropped only after the cut, or the count of the last probe
	// would move others in their place.
	slices.SortFunc(out, func(a, b *call) int { return b.start.Compare(a.start) })
	out = out[:min(q, len(out))]
	return slices.DeleteFunc(out, func(cl *call) bool { return cl.lane != l || cl.backup || cl.moved || cl.shed })
}
