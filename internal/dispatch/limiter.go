package dispatch

import "sync"

// Limiter caps how many requests of a lane with a fixed limit are in
// flight over all endpoints (an auto lane has a limit.Controller per
// endpoint instead). Its limit can change while requests run
// (SetLaneLimit): lowering it never cancels anything, it only stops new
// starts until enough requests finish.
type Limiter struct {
	mu    sync.Mutex
	limit int
	used  int
}

// NewLimiter returns a limiter allowing n concurrent holders.
func NewLimiter(n int) *Limiter { return &Limiter{limit: max(n, 0)} }

// TryAcquire takes a slot if one is free and reports whether it did.
func (l *Limiter) TryAcquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.used >= l.limit {
		return false
	}
	l.used++
	return true
}

// Release returns a slot taken by TryAcquire.
func (l *Limiter) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.used > 0 {
		l.used--
	}
}

// SetLimit changes the limit; n < 0 counts as 0.
func (l *Limiter) SetLimit(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limit = max(n, 0)
}

// Free is the number of slots TryAcquire would grant now.
func (l *Limiter) Free() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.limit-l.used, 0)
}

// InFlight returns the slots held and the current limit.
func (l *Limiter) InFlight() (used, limit int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used, l.limit
}
