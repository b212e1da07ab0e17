package monitor

import (
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// StoreHealth is whether the store answers this runner's own reads and
// writes (counts, heartbeats, events); the dispatcher tracks its writes
// separately. It keeps the last counts read, so the view and the state
// machine go on while the store is away.
//
// Any failed call starts an outage, but only a successful write ends it: a
// full disk still answers reads, and a read that ended the outage made the
// runner write an event that failed and reopened it at once (a busy loop
// logging thousands of lines a second). While down, the periodic writes back
// off (see Due) and the outage is logged at its start and then at growing
// intervals, a bounded number of times however long it lasts.
type StoreHealth struct {
	mu       sync.Mutex
	down     bool
	since    time.Time // start of the outage, or of the healthy stretch
	cause    string
	failures int           // Failed calls in this outage
	gap      time.Duration // current retry gap of the periodic writes
	next     time.Time     // when the periodic writes try again
	logGap   time.Duration // current gap between "still down" lines
	logNext  time.Time     // when the next "still down" line is due
	// A store that flaps (some writes pass) starts an outage at most
	// once per StoreLogMin in the log; the others are counted.
	lastStart time.Time // when an outage start was last logged
	quiet     bool      // this outage's start was not logged, nor is its end
	unlogged  int       // outages not logged since the last logged start
	counts    []store.Count
	haveAny   bool
	noteErr   bool // the note beside the job could not be written (logged once)
}

// The periodic writes retry after StoreRetryMin, doubling up to
// StoreRetryMax; the outage is logged again after StoreLogMin, doubling up
// to StoreLogMax (so a day-long outage logs about 30 lines).
const (
	StoreRetryMin = 500 * time.Millisecond
	StoreRetryMax = 10 * time.Second
	StoreLogMin   = time.Minute
	StoreLogMax   = time.Hour
)

// OutageLog is the line, if any, a failed call is logged with.
type OutageLog struct {
	Kind     OutageLine
	Failures int // Failed calls in this outage
	Unlogged int // earlier outages (since the last line) not logged
}

type OutageLine int

const (
	LogNone      OutageLine = iota
	LogStarted              // the outage began
	LogStillDown            // it goes on; due for a reminder
)

// Failed records a failed call and says whether to log it.
func (h *StoreHealth) Failed(err error, now time.Time) OutageLog {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cause = err.Error()
	if !h.down {
		h.down, h.since, h.failures = true, now, 1
		h.gap, h.next = StoreRetryMin, now.Add(StoreRetryMin)
		h.logGap, h.logNext = StoreLogMin, now.Add(StoreLogMin)
		h.quiet = !h.lastStart.IsZero() && now.Sub(h.lastStart) < StoreLogMin
		if h.quiet {
			h.unlogged++
			return OutageLog{}
		}
		out := OutageLog{Kind: LogStarted, Failures: 1, Unlogged: h.unlogged}
		h.lastStart, h.unlogged = now, 0
		return out
	}
	h.failures++
	if !now.Before(h.next) {
		h.gap = min(2*h.gap, StoreRetryMax)
		h.next = now.Add(h.gap)
	}
	if now.Before(h.logNext) {
		return OutageLog{}
	}
	h.logGap = min(2*h.logGap, StoreLogMax)
	h.logNext = now.Add(h.logGap)
	out := OutageLog{Kind: LogStillDown, Failures: h.failures, Unlogged: h.unlogged}
	h.unlogged = 0
	return out
}

// NoteFailed reports whether writing the store note failed before, and
// records that it did.
func (h *StoreHealth) NoteFailed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.noteErr
	h.noteErr = true
	return was
}

// Due reports whether the periodic writes (heartbeat, history) should be
// tried at now: always while the store is up, after the backoff gap while
// it is down.
func (h *StoreHealth) Due(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down || !now.Before(h.next)
}

// OutageEnd is the outage a successful write ended.
type OutageEnd struct {
	Ended   bool
	Logged  bool // its start was logged, so its end is too
	DownFor time.Duration
	Cause   string
}

// Wrote records a successful write; it reports the outage that just ended.
func (h *StoreHealth) Wrote(now time.Time) OutageEnd {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		if h.since.IsZero() {
			h.since = now
		}
		return OutageEnd{}
	}
	end := OutageEnd{Ended: true, Logged: !h.quiet, DownFor: now.Sub(h.since), Cause: h.cause}
	h.down, h.since, h.cause, h.failures, h.quiet = false, now, "", 0, false
	return end
}

// State returns the outage's cause and start ("" when up).
func (h *StoreHealth) State() (cause string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return "", time.Time{}
	}
	return h.cause, h.since
}

// HealthyFor is how long the store has answered without a failure.
func (h *StoreHealth) HealthyFor(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down || h.since.IsZero() {
		return 0
	}
	return now.Sub(h.since)
}

// Keep remembers the last counts read.
func (h *StoreHealth) Keep(c []store.Count) {
	h.mu.Lock()
	h.counts, h.haveAny = c, true
	h.mu.Unlock()
}

// Last is the last counts read, and whether there were any.
func (h *StoreHealth) Last() ([]store.Count, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts, h.haveAny
}

// RateWindow is a worker's own finished samples per second over the last
// minute, from its dispatcher's counter.
type RateWindow struct {
	mu     sync.Mutex
	points []ratePoint
}

type ratePoint struct {
	t    time.Time
	done int64
}

// RateSpan is the window of a RateWindow.
const RateSpan = time.Minute

// Add records done at t and returns the rate over the last RateSpan.
func (w *RateWindow) Add(t time.Time, done int64) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.points = append(w.points, ratePoint{t, done})
	cut := 0
	for cut < len(w.points)-1 && t.Sub(w.points[cut].t) > RateSpan {
		cut++
	}
	w.points = w.points[cut:]
	first := w.points[0]
	if dt := t.Sub(first.t).Seconds(); dt > 0 {
		return float64(done-first.done) / dt
	}
	return 0
}
