package dispatch

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/store"
)

// Claiming ahead, so a slot is filled with work whose prefix it caches.
//
// Under concurrency: auto every endpoint has a limit of its own, so under
// load a slot frees on one endpoint at a time, and the store hands out
// work in its own order (later turns, then the oldest first turns): a
// sample claimed for that slot went there whatever its home, and the first
// turns of rows sharing a system prompt spread over every server (mt4 at
// 1,600 conversations: each of four servers answered turns of 99 of the
// 100 shared prefixes, against 32 with a fixed total and no per-endpoint
// limit). So an auto lane with affinity on and more than one endpoint
// claims up to backlogPerEndpoint samples per endpoint beyond its room and
// keeps them leased here. When an endpoint has room it takes, in claim
// order (later turns first), the kept samples whose home it is (the
// endpoint the affinity rule picks among every available endpoint, as if
// none were at its limit) or that have no home; only the room still left
// takes the others, oldest first, so no endpoint idles while work waits.
// Kept samples go back to pending (no attempt spent) when no endpoint
// accepts work, while the poison guard is armed, and when Run's loop ends.

// backlogPerEndpoint is how many claimed samples an auto lane keeps unsent
// per endpoint: with four endpoints and homes spread evenly, a slot that
// frees finds a sample homed on it in all but (3/4)^32 of cases.
const backlogPerEndpoint = 32

// waiting is a claimed sample not yet sent, with its affinity read once.
type waiting struct {
	c    store.Claimed
	a    affinity
	hist *convHistory       // what the turn before kept, when it fits c (history.go)
	plan *conversation.Plan // c's body decoded, when hist is nil
}

// backlogCapLocked is how many claimed samples lane l may keep unsent.
func (d *Dispatcher) backlogCapLocked(l *lane) int {
	if l.auto == nil || d.cfg.NoAffinity || len(d.eps) < 2 {
		return 0
	}
	return backlogPerEndpoint * len(d.eps)
}

// queueLocked is l's kept samples followed by the new claims, later turns
// first (the store's own order within each), and empties the backlog.
func queueLocked(l *lane, fresh []waiting) []waiting {
	q := append(l.backlog, fresh...)
	l.backlog = nil
	laterFirst(q)
	return q
}

// laterFirst puts later turns before first turns, keeping the order
// within each.
func laterFirst(q []waiting) {
	first := func(w waiting) int {
		if w.c.Turn == 0 {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(q, func(x, y waiting) int { return first(x) - first(y) })
}

// homeLocked is the endpoint the affinity rule sends a request of lane l
// with footprint est and affinity a to when no endpoint is at its limit,
// nil when the rule has no preference (no affinity, or every endpoint it
// would prefer is clearly more loaded than the least loaded).
func (d *Dispatcher) homeLocked(now time.Time, l *lane, est float64, a affinity) *endpoint {
	if a == (affinity{}) {
		return nil
	}
	eps, cands, byTokens := d.candidatesLocked(now, l, est, a, false)
	i, kept := chooseKept(cands, a, byTokens)
	if i < 0 || !kept {
		return nil
	}
	return eps[i]
}

// awayFromHomeLocked reports whether w has a home and the home has no room
// for it now (no slot, or, for a new conversation, no admission): it waits
// for room there while others are filled. A new conversation's home is
// its prefix's whatever admission says, so a conversation leaving an
// endpoint makes room for one of the prefixes it caches, not for the first
// new conversation in the queue.
func (d *Dispatcher) awayFromHomeLocked(now time.Time, l *lane, w waiting) bool {
	est := d.estimateLocked(l, w.c)
	home := d.homeLocked(now, l, est, w.a)
	if home == nil {
		return false
	}
	if home.roomLocked(l, now) > 0 && d.admitsLocked(home, est, w.a) {
		return false
	}
	return w.a.prev != home.url || !home.returnRoomLocked(l, now)
}

// sendQueue offers queue's samples of lane l to start, which reports
// whether it sent one: first, in order, those whose home has room or that
// have none (every sample when keep is 0), then the others, to whatever
// room is left. It returns the samples not sent, in order.
func (d *Dispatcher) sendQueue(l *lane, queue []waiting, keep int, start func(waiting) bool) []waiting {
	var away, unsent []waiting
	for _, w := range queue {
		d.mu.Lock()
		wait := keep > 0 && d.awayFromHomeLocked(d.now(), l, w)
		d.mu.Unlock()
		switch {
		case wait:
			away = append(away, w)
		case !start(w):
			unsent = append(unsent, w)
		}
	}
	d.mu.Lock()
	rank := make(map[string]int, len(away))
	for _, w := range away {
		rank[w.c.ID] = d.spillRankLocked(d.now(), l, w.a)
	}
	d.mu.Unlock()
	slices.SortStableFunc(away, func(x, y waiting) int { return rank[x.c.ID] - rank[y.c.ID] })
	for _, w := range away {
		if !start(w) {
			unsent = append(unsent, w)
		}
	}
	laterFirst(unsent)
	return unsent
}

// spillRankLocked is how far down a's prefix order (the rendezvous order
// of every endpoint's URL) the first endpoint with room for lane l is: a
// sample whose home is full spills to its next choice first, so a prefix
// that does not fit its home meets on one more server, not on all of
// them. A sample without a prefix ranks last.
func (d *Dispatcher) spillRankLocked(now time.Time, l *lane, a affinity) int {
	if a.prefix == 0 {
		return len(d.eps)
	}
	order := slices.Clone(d.eps)
	slices.SortFunc(order, func(x, y *endpoint) int {
		return cmp.Compare(rendezvous(a.prefix, y.url), rendezvous(a.prefix, x.url))
	})
	for i, e := range order {
		if e.roomLocked(l, now) > 0 {
			return i
		}
	}
	return len(d.eps)
}

// releaseBacklog returns every lane's kept samples to pending.
func (d *Dispatcher) releaseBacklog(storeCtx context.Context) {
	d.mu.Lock()
	var ids []string
	for _, l := range d.lanes {
		for _, w := range l.backlog {
			ids = append(ids, w.c.ID)
		}
		l.backlog = nil
	}
	d.mu.Unlock()
	d.releaseUnstarted(storeCtx, ids)
}

// releaseUnstarted returns claimed samples that were not started to
// pending without spending an attempt; their lanes have work again.
func (d *Dispatcher) releaseUnstarted(storeCtx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	err := d.storeDo(storeCtx, nil, func(ctx context.Context) error {
		return d.cfg.Store.Release(ctx, ids, d.cfg.Owner)
	})
	if err != nil && !errors.Is(err, store.ErrNotLeased) {
		// Only an aborted drain gives up on the store; the leases expire.
		d.log.Warn("unstarted samples not released", "samples", len(ids), "err", err)
	}
	d.mu.Lock()
	d.counters.Released += int64(len(ids))
	for _, l := range d.lanes {
		l.short = false
	}
	for _, id := range ids {
		delete(d.held, id)
	}
	d.mu.Unlock()
}
