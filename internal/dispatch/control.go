package dispatch

import (
	"fmt"
	"time"
)

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
	e.wakeDownNewsLocked() // a cut waiting to be judged was part of this
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
	if !e.brokenSince.IsZero() {
		// Still broken until it answers, but its keeper brought it back
		// (a restart, say): broken_after runs again from now.
		e.brokenSince = d.now()
	}
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
