package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logRate lets one log line per key through every interval and counts
// the ones it held back, which the next line reports: events that can
// repeat fast (retries, limit decisions) stay in the run log without
// flooding it.
type logRate struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
	held  map[string]int
}

func newLogRate(every time.Duration) *logRate {
	return &logRate{every: every, last: map[string]time.Time{}, held: map[string]int{}}
}

// allow reports whether a line for key may be logged at now, and how many
// lines for it were held back since the last one.
func (r *logRate) allow(key string, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if last, ok := r.last[key]; ok && now.Sub(last) < r.every {
		r.held[key]++
		return false, 0
	}
	r.last[key] = now
	n := r.held[key]
	delete(r.held, key)
	return true, n
}

// log writes msg with args at level through the limiter, keyed by key.
func (r *logRate) log(l *slog.Logger, level slog.Level, key, msg string, now time.Time, args ...any) {
	ok, held := r.allow(key, now)
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	l.Log(context.Background(), level, msg, args...)
}
