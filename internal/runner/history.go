package runner

import (
	"context"
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

// rows returns the current slot's rows after folding in snap. Counts made
// between the last write and a slot boundary go to the new slot.
func (h *history) rows(now time.Time, snap dispatch.Snapshot, load func(url string) (kv, queued, running float64)) []store.Minute {
	cur := tallyOf(snap)
	minute, _ := stats.SlotAt(now, h.started)
	if h.minute.IsZero() {
		h.base = cur
	} else if !minute.Equal(h.minute) {
		h.base = h.last
	}
	h.minute, h.last = minute, cur

	total := store.Minute{Time: minute, Worker: h.worker, Samples: int(cur.samples - h.base.samples), KVUsage: -1, Queued: -1, Running: -1}
	out := []store.Minute{}
	for _, e := range snap.Endpoints {
		c, b := cur.endpoints[e.URL], h.base.endpoints[e.URL]
		m := store.Minute{Time: minute, Worker: h.worker, Endpoint: e.URL, Tokens: c.tokens - b.tokens,
			Requests: c.requests - b.requests, Errors: c.errors - b.errors, InFlight: e.InFlight}
		m.KVUsage, m.Queued, m.Running = load(e.URL)
		total.Tokens += m.Tokens
		total.Requests += m.Requests
		total.Errors += m.Errors
		total.InFlight += m.InFlight
		out = append(out, m)
	}
	return append([]store.Minute{total}, out...)
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
