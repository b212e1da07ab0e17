package sim

import (
	"context"
	"time"
)

// sinceReady is simulated time since the server became ready; false before.
func (sc *scheduler) sinceReady() (time.Duration, bool) {
	r := sc.s.readySim.Load()
	if r < 0 {
		return 0, false
	}
	return sc.simNow - time.Duration(r), true
}

// checkFaults fires due faults; it reports false when the server crashed.
func (sc *scheduler) checkFaults() bool {
	for _, f := range sc.s.faults {
		if f.fired.Load() || !sc.due(f) {
			continue
		}
		f.fired.Store(true)
		f.firedAt.Store(int64(sc.simNow))
		switch f.Kind {
		case FaultCrash:
			sc.s.crash(f.ExitCode, f.Error)
			return false
		case FaultHang:
			sc.hung, sc.hangSince, sc.hangCode = true, sc.simNow, max(f.ExitCode, 1)
			sc.hangUntil = 0
			if f.For > 0 {
				sc.hangUntil = sc.simNow + f.For
			}
			sc.stuck.Store(true)
		case FaultZombie:
			sc.dead = true
			sc.stuck.Store(true)
			sc.deadPub.Store(true)
		case FaultSlow:
			sc.slow = f.Factor
			sc.slowUntil = 0
			if f.For > 0 {
				sc.slowUntil = sc.simNow + f.For
			}
		}
	}
	return true
}

func (sc *scheduler) due(f *faultState) bool {
	switch {
	case f.AfterRequests > 0:
		return sc.s.reqCount.Load() >= int64(f.AfterRequests)
	case f.AfterTokens > 0:
		return sc.tokens >= int64(f.AfterTokens)
	case f.KVAbove > 0:
		if float64(sc.inUse())/float64(sc.pool) < f.KVAbove {
			f.kvHigh = false
			return false
		}
		if !f.kvHigh {
			f.kvHigh, f.kvSince = true, sc.simNow
		}
		return sc.simNow-f.kvSince >= f.KVFor
	default:
		t, ok := sc.sinceReady()
		return ok && t >= f.At
	}
}

// nextFaultAt is the simulated time of the next time-triggered fault.
func (sc *scheduler) nextFaultAt() (time.Duration, bool) {
	r := sc.s.readySim.Load()
	if r < 0 {
		return 0, false
	}
	var next time.Duration
	found := false
	for _, f := range sc.s.faults {
		if f.fired.Load() || f.AfterRequests > 0 || f.AfterTokens > 0 || f.KVAbove > 0 {
			continue
		}
		t := time.Duration(r) + f.At
		if !found || t < next {
			next, found = t, true
		}
	}
	return next, found
}

// waitHang holds the scheduler still; the watchdog crashes the server when
// a batch stays stuck longer than WatchdogTimeout.
func (sc *scheduler) waitHang(ctx context.Context) bool {
	sc.publish()
	var until time.Duration
	watchdog := false
	if sc.hangUntil > 0 {
		until = sc.hangUntil
	}
	if sc.cfg.WatchdogTimeout > 0 && len(sc.running) > 0 {
		w := sc.hangSince + sc.cfg.WatchdogTimeout
		if until == 0 || w < until {
			until, watchdog = w, true
		}
	}
	if until == 0 {
		<-ctx.Done()
		return false
	}
	if until <= sc.simNow {
		until = sc.simNow
	}
	start := sc.startIdle()
	if !sc.sleep(ctx, max(sc.realDelay(until-sc.simNow), 0)) {
		return false
	}
	sc.passIdle(start)
	if watchdog {
		sc.s.watchdogCrash(sc.hangCode)
		return false
	}
	sc.hung = false
	sc.stuck.Store(false)
	return true
}
