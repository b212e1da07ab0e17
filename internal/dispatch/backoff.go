package dispatch

import "time"

// Delay is how long a sample waits before its next attempt after attempt
// number attempt (1-based) failed with a retryable error: capped exponential
// backoff with full jitter, base*2^(attempt-1) capped at maxDelay, scaled by
// u, a uniform random number in [0, 1). Full jitter spreads the retries of
// many samples that failed together (a 429 burst) over the whole window.
func Delay(attempt int, base, maxDelay time.Duration, u float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if base <= 0 || maxDelay <= 0 {
		return 0
	}
	ceil := base
	for i := 1; i < attempt && ceil < maxDelay; i++ {
		ceil *= 2 // doubling stops at maxDelay, so it cannot overflow
	}
	ceil = min(ceil, maxDelay)
	u = min(max(u, 0), 1)
	return time.Duration(u * float64(ceil))
}

// breakerCooldown is how long an endpoint's breaker stays open after its
// n-th consecutive opening (1-based): first doubled each time, capped at 30 s.
func breakerCooldown(n int, first time.Duration) time.Duration {
	const ceiling = 30 * time.Second
	d := first
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}
