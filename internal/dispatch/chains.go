package dispatch

import "math"

// The order of escalation chains at the end of a job. A sample truncated
// in a lane escalates and runs again from the start in a bigger lane, so
// the job's longest chains start with a request of a lane that escalates:
// a fresh prompt there may still turn into two long requests end to end,
// while an escalation already known to need one is the shorter of the two
// to wait for. The job ends with its last chain, so the fresh work of a
// lane that escalates goes to the servers before the escalations it made,
// as a server's first-come queue orders them when a fixed limit keeps a
// few hundred requests waiting there; an adaptive limit keeps that queue
// short, and escalations sent as they come run ahead of the fresh prompts
// still in the store.
//
// So once an auto lane's own work ran out (every sample ingested and a
// claim came back short: what it gets since are answers put back, mostly
// escalations), it leaves up to chainHoldLocked of the escalations put
// into it in the store until every lane escalating into it has sent its
// fresh work (its claims came back short once everything was ingested;
// work put back into it later, a shed's releases, does not hold them
// again). Then they are claimed at once, on whichever endpoint has room.
// The hold is a count, not a time: no more than fill half the endpoints'
// KV pools at full length (the other half holds the last requests of the
// lane they came from), so the escalations of a long job still run mixed
// with the fresh work as they come, a few behind, and only the last of
// them wait. Held in the store rather than at a server, they can still go
// to any endpoint, and nothing is lost: held samples are pending. It only
// ever claims less, so the limits' crash, KV and shed rules come first.
// Measured with bench/sweep (bench/sweep/README.md): on kv231k (800
// prompts, one server) auto went from 0.96 of the best fixed setting to
// above it.

// chainState is what a lane counts for the hold (guarded by Dispatcher.mu).
type chainState struct {
	// drained: every sample was ingested and a claim came back short since,
	// so the lane's pending work is what answers put back into it.
	drained bool
	// putBack counts samples put back into the lane since its last short
	// claim (escalations, next turns, releases, retries), escalated those
	// of them that are escalations.
	putBack, escalated int
}

// notePutBackLocked records a sample put back into lane l; escalation
// says it came from a lane escalating into l.
func (l *lane) notePutBackLocked(escalation bool) {
	if !l.chain.drained {
		return
	}
	l.chain.putBack++
	if escalation {
		l.chain.escalated++
	}
}

// noteChainClaimLocked follows a claim of lane l that asked for n and got
// got samples: a short claim took everything pending.
func (d *Dispatcher) noteChainClaimLocked(l *lane, n, got int) {
	c := &l.chain
	if got < n {
		c.drained = c.drained || d.ingestDone()
		c.putBack, c.escalated = 0, 0
		return
	}
	c.putBack = max(c.putBack-got, 0)
	c.escalated = min(c.escalated, c.putBack)
}

// chainCapLocked caps n, what lane l would claim, so that the escalations
// it holds stay in the store (see above).
func (d *Dispatcher) chainCapLocked(l *lane, n int) int {
	held := d.chainHoldLocked(l)
	if held == 0 {
		return n
	}
	return min(n, max(l.chain.putBack-held, 0))
}

// chainHoldLocked is how many of the escalations put into lane l it
// leaves in the store now: 0 unless l is an auto lane whose own work ran
// out and a lane escalating into it still has fresh work in the store.
func (d *Dispatcher) chainHoldLocked(l *lane) int {
	if l.auto == nil || !l.chain.drained || l.chain.escalated == 0 || l.cfg.MaxTokens <= 0 {
		return 0
	}
	feeding := false
	for _, s := range d.lanes {
		if s.cfg.EscalateTo == l.cfg.Name && !s.chain.drained && d.serves(s.cfg.Name) {
			feeding = true
		}
	}
	if !feeding {
		return 0
	}
	pool := 0.0
	for _, e := range d.eps {
		pool += e.load.capacity
	}
	return min(l.chain.escalated, int(math.Floor(chainHoldShare*pool/float64(l.cfg.MaxTokens))))
}

// chainHoldShare is the share of the endpoints' KV pools the escalations
// an auto lane holds may fill at full length: released together, they run
// beside the last requests of the lane they came from, which fill the rest.
const chainHoldShare = 0.5
