package runner

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// storeHealth is whether the store answers this runner's own reads and
// writes (counts, heartbeats, events); the dispatcher tracks its writes
// separately. It keeps the last counts read, so the view and the state
// machine go on while the store is away.
//
// Any failed call starts an outage, but only a successful write ends it: a
// full disk still answers reads, and a read that ended the outage made the
// runner write an event that failed and reopened it at once (a busy loop
// logging thousands of lines a second). While down, the periodic writes back
// off (see due) and the outage is logged at its start and then at growing
// intervals, a bounded number of times however long it lasts.
type storeHealth struct {
	mu       sync.Mutex
	down     bool
	since    time.Time // start of the outage, or of the healthy stretch
	cause    string
	failures int           // failed calls in this outage
	gap      time.Duration // current retry gap of the periodic writes
	next     time.Time     // when the periodic writes try again
	logGap   time.Duration // current gap between "still down" lines
	logNext  time.Time     // when the next "still down" line is due
	// A store that flaps (some writes pass) starts an outage at most
	// once per storeLogMin in the log; the others are counted.
	lastStart time.Time // when an outage start was last logged
	quiet     bool      // this outage's start was not logged, nor is its end
	unlogged  int       // outages not logged since the last logged start
	counts    []store.Count
	haveAny   bool
	noteErr   bool // the note beside the job could not be written (logged once)
}

// The periodic writes retry after storeRetryMin, doubling up to
// storeRetryMax; the outage is logged again after storeLogMin, doubling up
// to storeLogMax (so a day-long outage logs about 30 lines).
const (
	storeRetryMin = 500 * time.Millisecond
	storeRetryMax = 10 * time.Second
	storeLogMin   = time.Minute
	storeLogMax   = time.Hour
)

// outageLog is the line, if any, a failed call is logged with.
type outageLog struct {
	kind     outageLine
	failures int // failed calls in this outage
	unlogged int // earlier outages (since the last line) not logged
}

type outageLine int

const (
	logNone      outageLine = iota
	logStarted              // the outage began
	logStillDown            // it goes on; due for a reminder
)

// failed records a failed call and says whether to log it.
func (h *storeHealth) failed(err error, now time.Time) outageLog {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cause = err.Error()
	if !h.down {
		h.down, h.since, h.failures = true, now, 1
		h.gap, h.next = storeRetryMin, now.Add(storeRetryMin)
		h.logGap, h.logNext = storeLogMin, now.Add(storeLogMin)
		h.quiet = !h.lastStart.IsZero() && now.Sub(h.lastStart) < storeLogMin
		if h.quiet {
			h.unlogged++
			return outageLog{}
		}
		out := outageLog{kind: logStarted, failures: 1, unlogged: h.unlogged}
		h.lastStart, h.unlogged = now, 0
		return out
	}
	h.failures++
	if !now.Before(h.next) {
		h.gap = min(2*h.gap, storeRetryMax)
		h.next = now.Add(h.gap)
	}
	if now.Before(h.logNext) {
		return outageLog{}
	}
	h.logGap = min(2*h.logGap, storeLogMax)
	h.logNext = now.Add(h.logGap)
	out := outageLog{kind: logStillDown, failures: h.failures, unlogged: h.unlogged}
	h.unlogged = 0
	return out
}

// noteFailed reports whether writing the store note failed before, and
// records that it did.
func (h *storeHealth) noteFailed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.noteErr
	h.noteErr = true
	return was
}

// due reports whether the periodic writes (heartbeat, history) should be
// tried at now: always while the store is up, after the backoff gap while
// it is down.
func (h *storeHealth) due(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down || !now.Before(h.next)
}

// outageEnd is the outage a successful write ended.
type outageEnd struct {
	ended   bool
	logged  bool // its start was logged, so its end is too
	downFor time.Duration
	cause   string
}

// wrote records a successful write; it reports the outage that just ended.
func (h *storeHealth) wrote(now time.Time) outageEnd {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		if h.since.IsZero() {
			h.since = now
		}
		return outageEnd{}
	}
	end := outageEnd{ended: true, logged: !h.quiet, downFor: now.Sub(h.since), cause: h.cause}
	h.down, h.since, h.cause, h.failures, h.quiet = false, now, "", 0, false
	return end
}

// state returns the outage's cause and start ("" when up).
func (h *storeHealth) state() (cause string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return "", time.Time{}
	}
	return h.cause, h.since
}

// healthyFor is how long the store has answered without a failure.
func (h *storeHealth) healthyFor(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down || h.since.IsZero() {
		return 0
	}
	return now.Sub(h.since)
}

func (h *storeHealth) keep(c []store.Count) {
	h.mu.Lock()
	h.counts, h.haveAny = c, true
	h.mu.Unlock()
}

func (h *storeHealth) last() ([]store.Count, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts, h.haveAny
}

// rateWindow is a worker's own finished samples per second over the last
// minute, from its dispatcher's counter.
type rateWindow struct {
	mu     sync.Mutex
	points []ratePoint
}

type ratePoint struct {
	t    time.Time
	done int64
}

const rateSpan = time.Minute

func (w *rateWindow) add(t time.Time, done int64) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.points = append(w.points, ratePoint{t, done})
	cut := 0
	for cut < len(w.points)-1 && t.Sub(w.points[cut].t) > rateSpan {
		cut++
	}
	w.points = w.points[cut:]
	first := w.points[0]
	if dt := t.Sub(first.t).Seconds(); dt > 0 {
		return float64(done-first.done) / dt
	}
	return 0
}

// untilStore runs fn and, on a shared store, runs it again with backoff
// for as long as it fails, as the dispatcher does with its writes: a
// database restarting under a starting worker is an outage to wait out, not
// a reason to exit. On an embedded store fn's error is returned at once.
func (r *runState) untilStore(ctx context.Context, fn func(context.Context) error) error {
	gap := 200 * time.Millisecond
	for {
		err := fn(ctx)
		if err == nil || !r.id.shared || ctx.Err() != nil {
			return err
		}
		r.storeFailed(ctx, err)
		if err := sleepCtx(ctx, gap); err != nil {
			return err
		}
		gap = min(2*gap, 5*time.Second)
	}
}

// noteStoreDown writes, while this runner cannot write its store, a note
// beside the job that `regen status` reads without the store: a live
// runner whose heartbeat is old is then DOWN with the store as the cause,
// not DEAD. It is rewritten at every heartbeat, so a fresh one proves life.
func (r *runState) noteStoreDown(now time.Time) {
	cause, since := r.health.state()
	if cause == "" {
		return
	}
	n := monitor.StoreNote{Owner: r.id.owner, PID: os.Getpid(), Host: r.id.host, Time: now, Since: since, Cause: cause}
	if err := monitor.WriteStoreNote(r.o.Spec.StateDir(), n); err != nil && !r.health.noteFailed() {
		r.o.Logger.Warn("store down note", "err", err)
	}
}

// forgetStoreNote removes this runner's note once the store takes writes
// again, and at exit.
func (r *runState) forgetStoreNote() {
	if err := monitor.RemoveStoreNote(r.o.Spec.StateDir(), os.Getpid()); err != nil {
		r.o.Logger.Warn("store down note", "err", err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
