package dispatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/llm"
)

// The burn guard: whose fault is a server error? A server that breaks in
// the middle of a job (a 500 to everything, an HTML page, no headers)
// fails every sample the same way; spending their attempts would
// dead-letter the dataset in minutes. A sample's own error is the same
// sample failing while the endpoint answers others. So a server error
// (serverFault) spends nothing unless the sample failed so before and the
// endpoint has since answered a request sent after that failure. Once
// PoisonAfter distinct samples in a row failed on one endpoint with the
// same error (or twice as many failures of any server error) and it
// answered nothing sent meanwhile, the endpoint is broken: paused behind
// its breaker (DOWN, the error as evidence), probed with one request at a
// time, resumed at the first answer. Every endpoint broken for BrokenAfter
// stops Run with a BrokenError; its samples are pending, no attempt spent.
// The rule is the same for the first request and the ten-thousandth; until
// a first request is accepted the poison guard sees these errors first.

// burnEvidence is what the dispatcher knows about a server error of one
// request when it settles.
type burnEvidence struct {
	// repeat: the sample failed with a server error before, since Run started.
	repeat bool
	// servedSince: the endpoint has answered a request sent after that failure.
	servedSince bool
	// convicted: that failure was judged the sample's own; alone: no other
	// sample failed on the endpoint since it last answered. A sample left
	// alone at the end of the job keeps failing its own way.
	convicted, alone bool
	// broken: the endpoint is already paused as broken.
	broken bool
	// distinct and failures: the endpoint's streak (this failure
	// included): distinct samples failing with the same error, and
	// failures with any server error, since it last answered a request.
	distinct, failures int
	// after is the trip count (Config.PoisonAfter).
	after int
}

// burnVerdict is what to do about it.
type burnVerdict int

const (
	burnEndpoint burnVerdict = iota // the endpoint's fault: the sample goes back unspent
	burnTrip                        // the same, and the streak breaks the endpoint
	burnSample                      // the sample's own: an attempt is spent
)

// judgeBurn decides; it is pure.
func judgeBurn(ev burnEvidence) burnVerdict {
	switch {
	case ev.broken:
		return burnEndpoint
	case ev.repeat && (ev.servedSince || ev.convicted && ev.alone):
		return burnSample
	case ev.distinct >= ev.after || ev.failures >= 2*ev.after:
		return burnTrip
	}
	return burnEndpoint
}

// serverFault returns the streak key of an error that may be its
// endpoint's rather than its sample's: an HTTP 5xx (or a 5xx event) from
// a live server, or an answer that is not the API (llm.Error.EndpointFault).
func serverFault(err error) (key string, ok bool) {
	var e *llm.Error
	if !errors.As(err, &e) {
		return "", false
	}
	if !e.EndpointFault && (e.Class != llm.Retryable || e.Status < 500) {
		return "", false
	}
	// Request ids and counters in a message do not make another error.
	return fmt.Sprintf("%d %s", e.Status, strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '#'
		}
		return r
	}, e.Msg)), true
}

// burnStreak is an endpoint's run of server errors since it last answered.
type burnStreak struct {
	key      string
	since    time.Time // its first failure
	samples  map[string]bool
	failures int
	// first is the streak's first sample; others counts failures of other
	// samples, any error.
	first  string
	others int
}

// add records sample id failing with key at now, okStart being the start
// of the latest request the endpoint answered: an answer to a request sent
// after the streak began ends it, and another error starts a new count of
// distinct samples. At most `bound` samples are remembered.
func (s *burnStreak) add(id, key string, now, okStart time.Time, bound int) {
	if s.samples == nil || !okStart.IsZero() && !okStart.Before(s.since) {
		*s = burnStreak{since: now, samples: map[string]bool{}, first: id}
	}
	if id != s.first {
		s.others++
	}
	if key != s.key {
		s.key = key
		clear(s.samples)
	}
	if len(s.samples) < bound {
		s.samples[id] = true
	}
	s.failures++
}

// alone reports whether id is the only sample that failed in the streak
// (since the endpoint last answered), whatever the errors.
func (s *burnStreak) alone(id string) bool {
	return s.others == 0 && s.first == id
}

// faultMark is a sample's last server error: when, and whether it was
// judged the sample's own.
type faultMark struct {
	at  time.Time
	own bool
}

// maxFaulted bounds the memory of samples that failed with a server error.
const maxFaulted = 4096

// burnLocked judges a server error (key) of c's request cl: the sample's
// own keeps verdict v (an attempt spent), the endpoint's gives the sample
// back unspent; d.mu is held.
func (d *Dispatcher) burnLocked(cl *call, id string, v verdict, key string, now time.Time) verdict {
	switch d.judgeBurnLocked(cl, id, key, now) {
	case burnSample:
		return v
	case burnTrip:
		v.trip = true
	}
	v.out, v.burnt = outDefer, true
	return v
}

// judgeBurnLocked gathers the evidence, judges it, and marks the endpoint
// broken when the streak trips; d.mu is held.
func (d *Dispatcher) judgeBurnLocked(cl *call, id, key string, now time.Time) burnVerdict {
	e := cl.ep
	mark, repeat := d.faulted[id]
	e.streak.add(id, key, now, e.okStart, d.cfg.PoisonAfter)
	ev := burnEvidence{repeat: repeat, servedSince: repeat && !e.okStart.IsZero() && !e.okStart.Before(mark.at), convicted: mark.own, alone: e.streak.alone(id),
		broken: !e.brokenSince.IsZero(), distinct: len(e.streak.samples), failures: e.streak.failures, after: d.cfg.PoisonAfter}
	verdict := judgeBurn(ev)
	if len(d.faulted) >= maxFaulted {
		for k := range d.faulted { // drop one at random
			delete(d.faulted, k)
			break
		}
	}
	d.faulted[id] = faultMark{at: now, own: verdict == burnSample}
	if verdict == burnTrip {
		e.brokenSince, e.brokenSamples = now, max(ev.distinct, 1)
		d.log.Warn("endpoint broken: samples in a row fail with the same server error and nothing succeeds; pausing it, probing with one request at a time",
			"endpoint", e.url, "samples", ev.distinct, "failures", ev.failures, "err", e.lastDown)
	}
	return verdict
}

// answeredLocked records an answer from e to a request sent at start: the
// streak ends and a broken endpoint is back; d.mu is held.
func (d *Dispatcher) answeredLocked(e *endpoint, start time.Time) {
	if start.After(e.okStart) {
		e.okStart = start
	}
	if !e.brokenSince.IsZero() {
		d.log.Info("endpoint recovered: it answered a request", "endpoint", e.url, "broken_for", d.now().Sub(e.brokenSince).Round(time.Second))
		e.brokenSince, e.brokenSamples = time.Time{}, 0
	}
}

// brokenLocked returns the error that stops Run once every endpoint has
// been broken for BrokenAfter, else nil; d.mu is held. An endpoint its
// keeper paused (down, restarting, stalled) is in the keeper's hands: the
// run waits for the keeper's verdict instead.
func (d *Dispatcher) brokenLocked(now time.Time) error {
	if d.cfg.BrokenAfter <= 0 || d.cfg.PoisonAfter <= 0 {
		return nil
	}
	be := &BrokenError{After: d.cfg.BrokenAfter}
	var latest time.Time
	for _, e := range d.eps {
		if e.brokenSince.IsZero() || e.paused {
			return nil
		}
		if e.brokenSince.After(latest) {
			latest = e.brokenSince
		}
		be.Endpoints = append(be.Endpoints, BrokenEndpoint{URL: e.url, Since: e.brokenSince, Samples: e.brokenSamples, Err: e.lastDown})
	}
	if now.Sub(latest) < d.cfg.BrokenAfter {
		return nil
	}
	return be
}

// BrokenError is the reason Run stops when every endpoint stayed broken.
type BrokenError struct {
	After     time.Duration
	Endpoints []BrokenEndpoint
}

// BrokenEndpoint is one broken endpoint and its evidence.
type BrokenEndpoint struct {
	URL     string
	Since   time.Time
	Samples int    // distinct samples that failed in a row when it broke
	Err     string // the last error it answered with
}

func (e *BrokenError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dispatch stopped: every endpoint has been broken for %s (monitor.broken_after): samples in a row failed there with the same server error "+
		"while nothing succeeded, so the server is at fault, not the samples; ", e.After)
	eps := slices.Clone(e.Endpoints)
	slices.SortFunc(eps, func(a, b BrokenEndpoint) int { return strings.Compare(a.URL, b.URL) })
	for i, ep := range eps {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s (broken since %s after %d samples in a row)", ep.URL, ep.Err, ep.Since.Format(time.TimeOnly), ep.Samples)
	}
	b.WriteString("; its failures spent no attempt and every unfinished sample is pending: fix the server (its log says why) and run again")
	return b.String()
}
