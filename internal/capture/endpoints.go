package capture

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
)

// Endpoint is one capture server and the client that speaks its contract.
type Endpoint struct {
	URL    string
	Client Client
}

// ErrAllDown is returned when every capture endpoint has been down for
// Config.DownAfter.
var ErrAllDown = errors.New("every capture endpoint is down")

// endpoint is a server's state: requests in flight, and after a failure of
// its own, how long it rests and since when it has been failing.
type endpoint struct {
	Endpoint
	inflight  int
	fails     int       // failures in a row
	until     time.Time // no request before this
	downSince time.Time // first failure of the current run of them; zero when up
	lastErr   error
}

// endpoints spreads requests over the servers that are up, least busy
// first, and backs a failing one off (doubling up to 30 s) without
// spending any key's attempt.
type endpoints struct {
	mu        sync.Mutex
	eps       []*endpoint
	downAfter time.Duration
}

func newEndpoints(eps []Endpoint, downAfter time.Duration) *endpoints {
	out := &endpoints{downAfter: downAfter}
	for _, e := range eps {
		out.eps = append(out.eps, &endpoint{Endpoint: e})
	}
	return out
}

// acquire returns the least busy endpoint that is up, waiting while none
// is, and ErrAllDown (with each one's last error) once all have been down
// for downAfter.
func (e *endpoints) acquire(ctx context.Context) (*endpoint, error) {
	for {
		ep, wait, err := e.pick(time.Now())
		if ep != nil || err != nil {
			return ep, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

func (e *endpoints) pick(now time.Time) (*endpoint, time.Duration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var best *endpoint
	wait := time.Second
	allDownSince := time.Time{}
	for _, ep := range e.eps {
		if ep.until.After(now) {
			wait = min(wait, ep.until.Sub(now))
		} else if best == nil || ep.inflight < best.inflight {
			best = ep
		}
		if ep.downSince.IsZero() {
			allDownSince = now.Add(time.Hour) // one is up: never all down
		} else if ep.downSince.After(allDownSince) {
			allDownSince = ep.downSince // the latest of them to go down
		}
	}
	if best != nil {
		best.inflight++
		return best, 0, nil
	}
	if e.downAfter > 0 && !allDownSince.After(now.Add(-e.downAfter)) {
		return nil, 0, e.downError(now)
	}
	return nil, max(wait, time.Millisecond), nil
}

func (e *endpoints) downError(now time.Time) error {
	var b strings.Builder
	for i, ep := range e.eps {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s down for %s: %v", ep.URL, now.Sub(ep.downSince).Round(time.Second), ep.lastErr)
	}
	return fmt.Errorf("%w for %s (capture.down_after): %s", ErrAllDown, e.downAfter, b.String())
}

// release ends a request on ep; failed says the server failed it. It
// reports whether ep went down or came back up with it (one log line a
// change, not one a request).
func (e *endpoints) release(ep *endpoint, failed error) (changed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.inflight--
	now := time.Now()
	if failed == nil {
		changed = !ep.downSince.IsZero()
		ep.fails, ep.downSince, ep.until, ep.lastErr = 0, time.Time{}, time.Time{}, nil
		return changed
	}
	ep.fails++
	ep.lastErr = failed
	if ep.downSince.IsZero() {
		ep.downSince, changed = now, true
	}
	// Half to all of the doubled delay: jitter spreads the workers'
	// returns, the floor keeps a down server from being hammered.
	ep.until = now.Add(dispatch.Delay(ep.fails, 500*time.Millisecond, 30*time.Second, 0.5+rand.Float64()/2))
	return changed
}
