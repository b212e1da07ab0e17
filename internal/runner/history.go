package runner

import (
	"context"
	"math"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/store"
)

// history turns the dispatcher's running counters into history rows
// (store.Minute) for the views, one per slot (stats.SlotAt: five seconds
// in a run's first hour, a minute after): each heartbeat rewrites the
// current slot's rows, so a crash loses at most one heartbeat of history.
type history struct {
	worker  string
	started time.Time
	minute  time.Time // the current slot's start
	base    tally     // counters at the start of the minute
	last    tally     // counters at the last write
	lastAt  time.Time // when that was
	gauges  map[string]gauges
}

// tally is the dispatcher's cumulative counters, total and per endpoint.
type tally struct {
	samples   int64
	endpoints map[string]epTally
}

type epTally struct{ tokens, requests, errors int64 }

func tallyOf(s dispatch.Snapshot) tally {
	// Samples finished: done, rejected by a quality rule or dead-lettered
	// (an answer to an earlier turn finishes no sample).
	t := tally{samples: s.Counters.Done + s.Counters.Rejected + s.Counters.DeadLettered, endpoints: map[string]epTally{}}
	for _, e := range s.Endpoints {
		var errs int64
		for _, n := range e.Errors {
			errs += n
		}
		t.endpoints[e.URL] = epTally{tokens: e.StreamedTokens, requests: e.Requests, errors: errs}
	}
	return t
}

// rows returns the current slot's rows after folding in snap. The counts
// made between the last write and a slot boundary are shared between the
// two slots in proportion to the time on each side (the closed slot's rows
// are written again with its share first): with a heartbeat every 2 s and
// 5 s slots, giving them all to the new slot made buckets alternate
// between two and three heartbeats' worth, a steady stream charted as a
// sawtooth.
func (h *history) rows(now time.Time, snap dispatch.Snapshot, load func(url string) (kv, queued, running float64)) []store.Minute {
	cur := tallyOf(snap)
	minute, _ := stats.SlotAt(now, h.started)
	var closed []store.Minute
	if h.minute.IsZero() {
		h.base = cur
	} else if !minute.Equal(h.minute) {
		split := h.last
		if span := now.Sub(h.lastAt); span > 0 && minute.After(h.lastAt) {
			split = between(h.last, cur, float64(minute.Sub(h.lastAt))/float64(span))
		}
		closed = h.slotRows(h.minute, split, snap, func(e dispatch.EndpointStats) gauges {
			if g, ok := h.gauges[e.URL]; ok {
				return g
			}
			return gauges{kv: -1, queued: -1, running: -1}
		})
		h.base = split
	}
	h.minute, h.last, h.lastAt = minute, cur, now
	out := h.slotRows(minute, cur, snap, func(e dispatch.EndpointStats) gauges {
		g := gauges{inFlight: e.InFlight}
		g.kv, g.queued, g.running = load(e.URL)
		return g
	})
	h.gauges = map[string]gauges{}
	for _, m := range out[1:] {
		h.gauges[m.Endpoint] = gauges{m.InFlight, m.KVUsage, m.Queued, m.Running}
	}
	return append(closed, out...)
}

// gauges are an endpoint's readings in the current slot's rows, kept to
// write the slot again when it closes.
type gauges struct {
	inFlight            int
	kv, queued, running float64
}

// slotRows are the rows of the slot starting at minute: the counts from
// h.base to cur, the total first.
func (h *history) slotRows(minute time.Time, cur tally, snap dispatch.Snapshot, read func(dispatch.EndpointStats) gauges) []store.Minute {
	total := store.Minute{Time: minute, Worker: h.worker, Samples: int(cur.samples - h.base.samples), KVUsage: -1, Queued: -1, Running: -1}
	out := []store.Minute{}
	for _, e := range snap.Endpoints {
		c, b := cur.endpoints[e.URL], h.base.endpoints[e.URL]
		g := read(e)
		m := store.Minute{Time: minute, Worker: h.worker, Endpoint: e.URL, Tokens: c.tokens - b.tokens,
			Requests: c.requests - b.requests, Errors: c.errors - b.errors, InFlight: g.inFlight, KVUsage: g.kv, Queued: g.queued, Running: g.running}
		total.Tokens += m.Tokens
		total.Requests += m.Requests
		total.Errors += m.Errors
		total.InFlight += m.InFlight
		out = append(out, m)
	}
	return append([]store.Minute{total}, out...)
}

// between is the tally a share frac (0..1) of the way from a to b.
func between(a, b tally, frac float64) tally {
	lerp := func(x, y int64) int64 { return x + int64(math.Round(float64(y-x)*frac)) }
	t := tally{samples: lerp(a.samples, b.samples), endpoints: map[string]epTally{}}
	for url, y := range b.endpoints {
		x := a.endpoints[url]
		t.endpoints[url] = epTally{tokens: lerp(x.tokens, y.tokens), requests: lerp(x.requests, y.requests), errors: lerp(x.errors, y.errors)}
	}
	return t
}

// recordHistory writes the current slot's rows; a failure is logged
// unless the store is known to be down (its outage is logged once), and the
// job goes on (history is for people, the samples are what matter).
func (r *runState) recordHistory(ctx context.Context, now time.Time) {
	if r.disp == nil {
		return
	}
	snap := r.disp.Snapshot()
	loads := map[string]*dispatch.ServerLoad{}
	for _, e := range snap.Endpoints {
		loads[e.URL] = r.fleet.FreshLoad(e, now)
	}
	rows := r.beats.hist.rows(now, snap, func(url string) (float64, float64, float64) {
		if l := loads[url]; l != nil {
			return l.KVUsage, l.Queued, l.Running
		}
		return -1, -1, -1
	})
	if err := r.o.Store.PutMinutes(ctx, rows); err != nil {
		if down, _ := r.health.State(); down == "" && ctx.Err() == nil {
			r.o.Logger.Warn("write history", "err", err)
		}
		return
	}
	r.storeWrote(ctx)
}
