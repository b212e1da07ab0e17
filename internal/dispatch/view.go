package dispatch

import "time"

// The readers below give one piece of the dispatcher's live state without
// copying the rest: the fleet reads each endpoint it owns (Endpoint), the
// runner the totals and counters of its heartbeat, where Snapshot copies
// every endpoint and lane.

// Endpoint is the endpoint at url as Snapshot reports it; false for a URL
// the dispatcher does not send to.
func (d *Dispatcher) Endpoint(url string) (EndpointStats, bool) {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.epByURL[url]
	if !ok {
		return EndpointStats{}, false
	}
	return d.endpointStatsLocked(e, now), true
}

// Totals is the dispatcher's work in flight summed over its endpoints.
type Totals struct {
	InFlight    int
	Tokens      int64     // streamed-token counters summed (EndpointStats.TokensTotal)
	Streamed    int64     // EndpointStats.StreamedTokens summed: what the views rate
	LastTokenAt time.Time // the latest chunk from any endpoint
}

// Totals sums the endpoints' requests in flight and streamed tokens.
func (d *Dispatcher) Totals() Totals {
	d.mu.Lock()
	defer d.mu.Unlock()
	var t Totals
	for _, e := range d.eps {
		t.InFlight += e.inflight
		t.Tokens += e.tokens.Load()
		t.Streamed += e.streamed.Load()
		if ns := e.lastToken.Load(); ns != 0 && time.Unix(0, ns).After(t.LastTokenAt) {
			t.LastTokenAt = time.Unix(0, ns)
		}
	}
	return t
}

// Counters are the sample outcomes since Run started.
func (d *Dispatcher) Counters() Counters {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counters
}

// StoreState says whether the store accepts the dispatcher's writes.
func (d *Dispatcher) StoreState() StoreStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.storeSt
}

// LaneStats is each lane's concurrency and timing, as Snapshot reports it.
func (d *Dispatcher) LaneStats() []LaneStats {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.laneStatsLocked(now)
}

// endpointStatsLocked is e's entry of a Snapshot.
func (d *Dispatcher) endpointStatsLocked(e *endpoint, now time.Time) EndpointStats {
	es := EndpointStats{
		URL:              e.url,
		InFlight:         e.inflight,
		Paused:           e.paused,
		PauseReason:      e.pauseReason,
		Breaker:          e.breakerState(now),
		BreakerOpenUntil: e.openUntil,
		TokensTotal:      e.tokens.Load(),
		CompletionTokens: e.completion.Load(),
		StreamedTokens:   e.streamed.Load(),
		Requests:         e.requests,
		LastServerDown:   e.lastDown,
		AutoLimit:        e.autoLimitLocked(),
		BrokenSince:      e.brokenSince,
		BrokenSamples:    e.brokenSamples,
	}
	if now.Before(e.holdUntil) {
		es.HeldUntil = e.holdUntil
	}
	if r, ok := e.client.(interface{ Replays() int64 }); ok {
		es.Replays = r.Replays()
	}
	if now.Before(e.holdUntil) || e.fixedCap > 0 {
		es.HoldSince, es.HoldReason, es.FixedCap = e.holdSince, e.holdReason, e.fixedCap
	}
	if e.inflight > 0 {
		es.BusySince = e.busySince
	}
	if ns := e.lastToken.Load(); ns != 0 {
		es.LastTokenAt = time.Unix(0, ns)
	}
	if len(e.errors) > 0 {
		es.Errors = map[string]int64{}
		for c, n := range e.errors {
			es.Errors[c.String()] = n
		}
	}
	d.loadStatsLocked(e, &es)
	return es
}

// autoLimitLocked is how many requests e's auto lanes may have at once:
// their limits summed, held to the crash ceiling they share (the one
// roomLocked enforces). The crash ceiling is applied here and nowhere else
// outside dispatch.
func (e *endpoint) autoLimitLocked() int {
	sum := 0
	for _, el := range e.lanes {
		if el.ctl != nil {
			sum += el.ctl.Limit()
		}
	}
	if e.ceiling > 0 {
		sum = min(sum, e.ceiling)
	}
	return sum
}

// lanesCeilingLocked is the ceiling e's auto lanes share after a crash
// under pressure: the highest of their controllers' ceilings (0 = none).
// NoteCrash sets e.ceiling from it and a rescaled pool moves it.
func (e *endpoint) lanesCeilingLocked() int {
	c := 0
	for _, el := range e.lanes {
		if el.ctl != nil {
			c = max(c, el.ctl.Ceiling())
		}
	}
	return c
}

// laneStatsLocked is the lanes' entries of a Snapshot.
func (d *Dispatcher) laneStatsLocked(now time.Time) []LaneStats {
	var out []LaneStats
	ages := d.inFlightAgesLocked(now)
	for _, l := range d.lanes {
		used, limit := l.lim.InFlight()
		if l.auto != nil {
			used, limit = 0, 0
			for _, e := range d.eps {
				used += e.lanes[l.idx].inflight
				if e.available(now) {
					limit += e.lanes[l.idx].ctl.Limit()
				}
			}
		}
		a := ages[l]
		out = append(out, LaneStats{Name: l.cfg.Name, InFlight: used, Limit: limit, Auto: l.auto != nil,
			MeanDuration: l.durations.mean(), Tail: l.durations.tail(a.youngest, a.oldest, a.n),
			EscalateTo: l.cfg.EscalateTo, Answered: l.answered, Escalated: l.escalated, Kept: len(l.backlog)})
	}
	return out
}
