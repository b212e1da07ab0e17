package runner

import (
	"context"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// storeHealth is whether the store answers this runner's own reads and
// writes (counts, heartbeats, events); the dispatcher tracks its writes
// separately. It keeps the last counts read, so the view and the state
// machine go on while the store is away.
type storeHealth struct {
	mu      sync.Mutex
	down    bool
	since   time.Time // start of the outage, or of the healthy stretch
	cause   string
	counts  []store.Count
	haveAny bool
}

// failed records a failed call; it reports whether an outage started.
func (h *storeHealth) failed(err error, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cause = err.Error()
	if h.down {
		return false
	}
	h.down, h.since = true, now
	return true
}

// ok records a successful call; it reports the outage that just ended.
func (h *storeHealth) ok(now time.Time) (ended bool, downFor time.Duration, cause string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		if h.since.IsZero() {
			h.since = now
		}
		return false, 0, ""
	}
	downFor, cause = now.Sub(h.since), h.cause
	h.down, h.since, h.cause = false, now, ""
	return true, downFor, cause
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
		if err == nil || !r.shared || ctx.Err() != nil {
			return err
		}
		r.storeFailed(ctx, err)
		if err := sleepCtx(ctx, gap); err != nil {
			return err
		}
		gap = min(2*gap, 5*time.Second)
	}
}
