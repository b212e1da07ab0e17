package dispatch

import "time"

// recentSize is how many answered requests a lane remembers for its
// duration estimates: enough for a stable mean, small enough to follow a
// change of prompt mix.
const recentSize = 256

// recentDurations is a ring of a lane's last answered request durations.
type recentDurations struct {
	d    [recentSize]time.Duration
	n    int // filled slots
	next int
}

func (r *recentDurations) add(d time.Duration) {
	r.d[r.next] = d
	r.next = (r.next + 1) % recentSize
	r.n = min(r.n+1, recentSize)
}

func (r *recentDurations) mean() time.Duration {
	if r.n == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.d[:r.n] {
		sum += d
	}
	return sum / time.Duration(r.n)
}

// residual is the expected time left for a request that has run for age:
// the mean of (d - age) over the remembered durations d longer than age.
// A request older than every one remembered has nothing to compare with;
// it is expected to run about as long again as it has (it is an outlier,
// and the last requests of a job are its outliers).
func (r *recentDurations) residual(age time.Duration) time.Duration {
	var sum time.Duration
	n := 0
	for _, d := range r.d[:r.n] {
		if d > age {
			sum += d - age
			n++
		}
	}
	if n == 0 {
		return age
	}
	return sum / time.Duration(n)
}

// tail is the expected time until the lane's inFlight requests, started
// between youngest and oldest ago, are all answered: the longer of the
// residuals of the youngest and the oldest. 0 when nothing is in flight
// or no request was answered yet.
func (r *recentDurations) tail(youngest, oldest time.Duration, inFlight int) time.Duration {
	if inFlight == 0 || r.n == 0 {
		return 0
	}
	return max(r.residual(youngest), r.residual(oldest))
}

// flightAges is the age range of one lane's requests in flight.
type flightAges struct {
	youngest, oldest time.Duration
	n                int
}

// inFlightAgesLocked returns the age range of each lane's requests in
// flight; d.mu must be held.
func (d *Dispatcher) inFlightAgesLocked(now time.Time) map[*lane]flightAges {
	ages := map[*lane]flightAges{}
	for _, e := range d.eps {
		for c := range e.calls {
			age := now.Sub(c.start)
			a, seen := ages[c.lane]
			if !seen || age < a.youngest {
				a.youngest = age
			}
			a.oldest = max(a.oldest, age)
			a.n++
			ages[c.lane] = a
		}
	}
	return ages
}
