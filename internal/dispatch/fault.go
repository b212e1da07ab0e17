package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/llm"
)

// Whose fault is a server-down error? A crash cuts every stream of a
// server at once and its health and token counters stop; a server that
// cuts (or never finishes) one prompt's stream every time keeps serving the
// others. The first kind must not spend attempts (an outage), the second
// must, or that one sample holds the head of the queue for ever, released
// and claimed again at every half-open probe.

// cutEvidence is what the dispatcher knows about a server-down failure of
// one request when it settles.
type cutEvidence struct {
	// repeat: the same sample failed with a server-down error before
	// (since this dispatcher started), and still has not succeeded.
	repeat bool
	// ownChunks: chunks this request streamed before it failed.
	ownChunks int64
	// othersTokens: tokens other requests on the endpoint streamed while
	// this one ran.
	othersTokens int64
	// servedSince: since this sample's previous failure the endpoint
	// answered another request or its generation counter moved.
	servedSince bool
	// isolated: no other sample failed with a server-down error on the
	// endpoint, and it was not paused, since this sample's (previous)
	// request started.
	isolated bool
	// retracted: the server's retraction counter rose while this request
	// ran, so a silent stream may be one the server put back in its queue.
	retracted bool
	// probed: a probe request was sent to learn whether the server works
	// (servedSince says whether it answered).
	probed bool
}

// cutVerdict is what to do about it.
type cutVerdict int

const (
	cutOutage    cutVerdict = iota // release, no attempt, open the breaker
	cutRelease                     // release, no attempt, the endpoint stays open
	cutSampleErr                   // the sample's fault: spend an attempt, retry with backoff or dead-letter
)

// judgeCut decides: a failure that other requests did not share while the
// server kept working is not an outage. The first one is free (a dying
// server can cut one stream before the rest), a repeat spends an attempt;
// a silent stream while the server retracted requests is the server's
// doing and never spends one.
func judgeCut(ev cutEvidence) cutVerdict {
	if !ev.isolated {
		return cutOutage
	}
	if !ev.repeat {
		if ev.othersTokens > 0 {
			return cutRelease
		}
		return cutOutage
	}
	if ev.ownChunks == 0 && ev.othersTokens == 0 && !ev.servedSince {
		return cutOutage // nothing says the server works
	}
	if ev.retracted {
		return cutRelease
	}
	return cutSampleErr
}

func (ev cutEvidence) String() string {
	s := fmt.Sprintf("failed again while the server worked: %d chunks streamed by this request, %d tokens by others meanwhile", ev.ownChunks, ev.othersTokens)
	if ev.probed {
		s += ", and a probe request answered"
	}
	return s
}

// A stream cut for bytes without a token (keep-alives, empty chunks) on a
// server with nothing else to compare it with, typically a job's last
// sample, would be an outage for ever: nothing says the server works, the
// breaker's probe is that sample again. One small request asks the server
// itself; its answer is the evidence that the server's other requests
// progress, so the cut is the sample's.

// probeBody is the request that asks whether the server works.
var probeBody = []byte(`{"messages":[{"role":"user","content":"Say OK."}]}`)

// probeTimeout bounds that request; a server that streams it nothing but
// keep-alives is cut by the client's own idle rule before this.
const probeTimeout = 2 * time.Minute

// serverAnswersLocked reports whether e answers a one-token request; d.mu
// is held, and released while it waits.
func (d *Dispatcher) serverAnswersLocked(e *endpoint) bool {
	d.mu.Unlock()
	defer d.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	_, err := e.client.Chat(ctx, llm.Request{Model: d.cfg.Model, Body: probeBody, MaxTokens: 1}, nil)
	if err != nil {
		d.log.Info("server probe after a stream without progress failed", "endpoint", e.url, "err", err)
	}
	return err == nil
}

// suspect remembers a sample's last server-down failure.
type suspect struct {
	ep    *endpoint
	start time.Time // when its failed request started
	at    time.Time // when it failed
}

// maxSuspects bounds the memory of failed samples; a mass outage fills it
// with samples that mostly succeed next time and leave it.
const maxSuspects = 4096

// downMark is one server-down failure of a sample on an endpoint.
type downMark struct {
	id string
	at time.Time
}

// noteDownLocked records a server-down failure of sample id on e and
// wakes the cuts waiting to see whether they were alone (settleCutLocked).
func (e *endpoint) noteDownLocked(id string, at time.Time) {
	if e.downs[0].id != id || id == "" {
		e.downs[1] = e.downs[0]
	}
	e.downs[0] = downMark{id: id, at: at}
	e.wakeDownNewsLocked()
}

// wakeDownNewsLocked tells the waiting cuts that e had a down mark or a pause.
func (e *endpoint) wakeDownNewsLocked() {
	if e.downNews != nil {
		close(e.downNews)
		e.downNews = nil
	}
}

// downNewsLocked is closed at e's next server-down mark or pause.
func (e *endpoint) downNewsLocked() <-chan struct{} {
	if e.downNews == nil {
		e.downNews = make(chan struct{})
	}
	return e.downNews
}

// cutSettle is how long a cut that looked alone waits for the other cuts
// of the same crash. A crash cuts every stream at once, but each is judged
// by its own goroutine: the first one judged saw no other failure yet and,
// when its sample had been cut before, was blamed and spent an attempt
// (TestCrashOnLoad under load: 1 run in 18 at one stop, 1 in 180 at the
// next; a sample cut first in a crash, released free, sent again at once
// and refused by the dead server before the others' cuts were marked).
// The others' marks and the supervisor's pause came within 10 ms on a
// loaded 2-core machine; a cut that was alone waits this long before it
// is released or retried.
const cutSettle = time.Second

// settleCutLocked holds verdict v of a cut that looked alone (alive) until
// another sample's server-down mark or a pause on its endpoint shows it was
// an outage, or cutSettle passes; d.mu is held, and released while it waits.
func (d *Dispatcher) settleCutLocked(cl *call, id string, v verdict) verdict {
	if !v.alive {
		return v
	}
	e := cl.ep
	t := time.NewTimer(cutSettle)
	defer t.Stop()
	for !e.otherDownSinceLocked(id, cl.start) {
		news := e.downNewsLocked()
		d.mu.Unlock()
		expired := false
		select {
		case <-news:
		case <-t.C:
			expired = true
		}
		d.mu.Lock()
		if expired && !e.otherDownSinceLocked(id, cl.start) {
			return v // alone after all: the verdict stands
		}
	}
	// Not alone: an outage, whatever the sample's history.
	v.alive, v.fault = false, ""
	return v
}

// otherDownSinceLocked reports whether a sample other than id failed with a
// server-down error on e, or e was paused, at or after t.
func (e *endpoint) otherDownSinceLocked(id string, t time.Time) bool {
	if !e.pausedAt.IsZero() && !e.pausedAt.Before(t) {
		return true
	}
	for _, m := range e.downs {
		if !m.at.IsZero() && m.id != id && !m.at.Before(t) {
			return true
		}
	}
	return false
}

// judgeDownLocked turns verdict v of a server-down failure of c's request
// cl into an outage, a free release or the sample's fault; d.mu is held.
func (d *Dispatcher) judgeDownLocked(cl *call, id string, v verdict, now time.Time) verdict {
	e := cl.ep
	s, repeat := d.suspects[id]
	ev := cutEvidence{
		repeat:       repeat,
		ownChunks:    cl.generated.Load(),
		othersTokens: max(e.tokens.Load()-cl.tokens0-cl.generated.Load(), 0),
		isolated:     !e.otherDownSinceLocked(id, cl.start),
		retracted:    !e.load.retractedAt.IsZero() && !e.load.retractedAt.Before(cl.start),
	}
	if repeat {
		ev.servedSince = e.servedAt.After(s.at)
		ev.isolated = ev.isolated && !s.ep.otherDownSinceLocked(id, s.start)
	}
	if cl.noProgress && repeat && ev.isolated && ev.ownChunks == 0 && ev.othersTokens == 0 && !ev.servedSince {
		ev.probed, ev.servedSince = true, d.serverAnswersLocked(e)
		ev.isolated = ev.isolated && !e.otherDownSinceLocked(id, cl.start) // news while it waited
	}
	// Every failure is marked, whatever the verdict: the next sample to
	// fail on e sees it was not alone.
	e.noteDownLocked(id, now)
	switch judgeCut(ev) {
	case cutRelease:
		v.alive = true
	case cutSampleErr:
		v.alive, v.fault = true, ev.String()
	}
	if len(d.suspects) >= maxSuspects {
		for k := range d.suspects { // drop one at random
			delete(d.suspects, k)
			break
		}
	}
	d.suspects[id] = suspect{ep: e, start: cl.start, at: now}
	return d.settleCutLocked(cl, id, v)
}

// isRefusal reports whether err is the server refusing the request itself
// (a key, a model, a failing server answering every request the same):
// while no request has been accepted, the poison guard counts these and
// the sample goes back without spending an attempt.
func isRefusal(err error) bool {
	var le *llm.Error
	if !errors.As(err, &le) {
		return false
	}
	return le.Status == 401 || le.Status == 403 || le.Status == 404 || isServerError(le)
}

func statusOf(err error) int {
	var e *llm.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func retryAfterOf(err error) time.Duration {
	var e *llm.Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// Backpressure: a server that answers 429 (or 503 with Retry-After) is
// alive and asks for less. It takes no new request until its Retry-After
// has passed (without one, the breaker's doubling cooldown), the sample
// goes back without spending an attempt, and its load is cut at the start
// of each such hold: an auto lane's limit backs off, and a fixed lane's
// share of that endpoint is capped at half what it had in flight, growing
// back by one per answer (additive increase, multiplicative decrease).

// pressureHold is how long an endpoint takes no new requests after its
// n-th backpressure answer in a row (1-based) that asked for retryAfter.
func pressureHold(n int, retryAfter, first, maxHold time.Duration) time.Duration {
	h := retryAfter
	if h <= 0 {
		h = breakerCooldown(n, first)
	}
	return min(h, maxHold)
}

// pressureCap is the cap on an endpoint's fixed-lane requests after a
// backpressure answer with inFlight of them in flight (cap 0 = none).
func pressureCap(cur, inFlight int) int {
	base := inFlight
	if cur > 0 {
		base = min(cur, inFlight)
	}
	return max(base/2, 1)
}

// recoverCap grows a cap by one per answer; it is lifted (0) once it
// reaches limit, the most the fixed lanes could send anyway.
func recoverCap(cap, limit int) int {
	if cap <= 0 || cap+1 >= limit {
		return 0
	}
	return cap + 1
}

// backpressureLocked holds e after a backpressure answer to cl (fixed: its
// fixed-lane requests in flight before it ended) and, at the start of a
// hold, cuts e's load and logs it; d.mu is held.
func (d *Dispatcher) backpressureLocked(cl *call, fixed int, reqErr error, now time.Time) {
	e := cl.ep
	if cl.probe {
		e.probing = false
	}
	ra := retryAfterOf(reqErr)
	if now.Before(e.holdUntil) {
		// An answer to a request sent before the hold: already counted, but
		// its own Retry-After runs from now, so the hold may grow.
		if ra > 0 {
			if until := now.Add(min(ra, d.cfg.MaxDelay)); until.After(e.holdUntil) {
				e.holdUntil = until
			}
		}
		return
	}
	e.pressN++
	hold := pressureHold(e.pressN, ra, d.cfg.BreakerCooldown, d.cfg.MaxDelay)
	e.holdUntil = now.Add(hold)
	e.holdSince, e.holdReason = now, reqErr.Error()
	if ra > 0 {
		e.holdReason += fmt.Sprintf(" (Retry-After %s)", ra)
	}
	args := []any{"endpoint", e.url, "retry_after", ra, "hold", hold, "in_flight", e.inflight + 1, "err", reqErr}
	if cl.lane.auto == nil {
		e.fixedCap = pressureCap(e.fixedCap, fixed)
		args = append(args, "fixed_lanes_cap", e.fixedCap)
	}
	why := fmt.Sprintf("backpressure: %s", reqErr)
	for i := range e.lanes {
		el := &e.lanes[i]
		if el.ctl == nil {
			continue
		}
		dec := el.ctl.Backpressure(now, el.inflight+btoi(cl.lane.idx == i), why)
		args = append(args, "limit_"+d.lanes[i].cfg.Name, dec.To)
	}
	d.log.Warn("endpoint backpressure; holding new requests", args...)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fixedLimitSum is the sum of the fixed lanes' limits.
func (d *Dispatcher) fixedLimitSum() int {
	n := 0
	for _, l := range d.lanes {
		if l.auto == nil {
			n += l.cfg.Concurrency
		}
	}
	return n
}

// urls lists the endpoints' URLs (fixed after New).
func (d *Dispatcher) urls() []string {
	out := make([]string, len(d.eps))
	for i, e := range d.eps {
		out[i] = e.url
	}
	return out
}
