package supervise

import (
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/job"
)

// RestartPolicy counts a server's failures within a window and yields the
// delay before the next start; the Max-th failure within Window is final.
// Both the supervised process and the in-process simulator restart by it.
type RestartPolicy struct {
	Restart    job.Restart
	MaxBackoff time.Duration
	failures   []time.Time
}

// Fail records a failure at now. It returns the backoff before the next
// start, the failures counted within the window, and ok=false when the
// policy is exhausted.
func (p *RestartPolicy) Fail(now time.Time) (delay time.Duration, failures int, ok bool) {
	p.failures = slices.DeleteFunc(p.failures, func(t time.Time) bool { return now.Sub(t) > p.Restart.Window })
	p.failures = append(p.failures, now)
	if len(p.failures) >= p.Restart.Max {
		return 0, len(p.failures), false
	}
	return backoff(p.Restart.Backoff, p.MaxBackoff, len(p.failures)), len(p.failures), true
}

// Failures is how many failures were counted within the window at the last Fail.
func (p *RestartPolicy) Failures() int { return len(p.failures) }

// backoff is base doubled for each earlier failure, capped.
func backoff(base, capped time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < capped; i++ {
		d *= 2
	}
	return min(d, capped)
}
