package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/quality"
	"github.com/regen-dev/regen/internal/store"
)

// outcome is what happens to a sample after its request.
type outcome int

const (
	outComplete outcome = iota // the last answer: done
	outNextTurn                // a good answer with a turn after it: pending at the next turn
	outReject                  // a quality rule refused the answer
	outEscalate
	outRelease
	outRetry
	outDead
)

// verdict is the decision about one finished request.
type verdict struct {
	out       outcome
	class     llm.Class // the error's class, 0 for an answer
	check     quality.Verdict
	endReason string // outComplete before the plan's last turn: why
	unsent    bool   // no request could be built, so the endpoint saw nothing
}

// decide maps a request's answer or error to an outcome; it is pure apart
// from reading the configuration.
func (d *Dispatcher) decide(l *lane, c store.Claimed, t *turn, res llm.Result, reqErr, cause error) verdict {
	switch {
	case reqErr == nil && res.FinishReason == "length" && l.cfg.EscalateTo != "":
		return verdict{out: outEscalate}
	case reqErr == nil:
		if v := d.cfg.Quality.Check(quality.Request{Tools: t.tools, Reasoning: d.cfg.Reasoning}, res); v.Rejected() {
			return verdict{out: outReject, check: v}
		}
		ok, why := t.plan.Continue(t.index, res)
		if ok {
			return verdict{out: outNextTurn}
		}
		return verdict{out: outComplete, endReason: why}
	case releaseCause(cause):
		return verdict{out: outRelease}
	}
	class := llm.ClassOf(reqErr)
	switch class {
	case llm.ServerDown:
		return verdict{out: outRelease, class: class}
	case llm.BadRequest:
		return verdict{out: outDead, class: class}
	}
	if c.Attempts+1 >= d.cfg.MaxAttempts {
		return verdict{out: outDead, class: class}
	}
	return verdict{out: outRetry, class: class}
}

// settle updates the endpoint, records the sample's fate in the store and
// frees its lane slot. t is nil when no request could be built.
func (d *Dispatcher) settle(storeCtx context.Context, cl *call, l *lane, c store.Claimed, t *turn, res llm.Result, reqErr, cause error) {
	now := d.now()
	var v verdict
	if t == nil {
		v = verdict{out: outDead, class: llm.BadRequest, unsent: true}
	} else {
		v = d.decide(l, c, t, res, reqErr, cause)
	}
	d.settleEndpoint(cl, v, res, reqErr, now)

	target, what, op := d.storeOp(cl.ep.url, l, c, t, v, res, reqErr, now)
	err := d.storeOutcome(storeCtx, c, what, op)
	// The guard learns of a refusal before the sample leaves the books: its
	// budget counts requests in flight, and the claim loop wakes at once.
	if err == nil && v.out == outDead && v.class == llm.BadRequest && t != nil && d.guard.badRequest(c.ID, reqErr.Error()) {
		d.tripGuard(storeCtx, reqErr.Error())
	}
	if l.auto == nil {
		l.lim.Release()
	}
	d.retire(c, err, func() { d.count(v, res, l, target) })
}

// releaseCause reports whether the dispatcher cancelled a request to give
// its sample back without spending an attempt.
func releaseCause(cause error) bool {
	return errors.Is(cause, errPaused) || errors.Is(cause, errDrain) || errors.Is(cause, errMoved) || errors.Is(cause, errShed)
}

// storeOutcome writes a sample's outcome with op, logging a write that did
// not take.
func (d *Dispatcher) storeOutcome(storeCtx context.Context, c store.Claimed, what string, op func(context.Context) error) error {
	err := d.storeDo(storeCtx, nil, op)
	switch {
	case errors.Is(err, store.ErrNotLeased), errors.Is(err, store.ErrWrongTurn):
		// The lease expired and someone else owns the sample now; its
		// outcome is theirs to record.
		d.log.Warn("lease lost", "sample", c.ID, "op", what, "err", err)
	case err != nil:
		// Only an aborted drain gives up on the store: the sample stays
		// leased to us and comes back through expiry, its result lost but
		// nothing stored twice.
		d.log.Warn("outcome not stored", "sample", c.ID, "op", what, "err", err)
	}
	return err
}

// retire takes a settled sample off the books; counted runs under d.mu
// when its outcome was stored (err nil).
func (d *Dispatcher) retire(c store.Claimed, err error, counted func()) {
	d.mu.Lock()
	d.inflight--
	delete(d.held, c.ID)
	if err == nil {
		counted()
	}
	d.mu.Unlock()
	d.signal()
}

// settleEndpoint updates the endpoint's error counts and breaker.
// Breaker transitions are logged; single failures only go to counters.
func (d *Dispatcher) settleEndpoint(cl *call, v verdict, res llm.Result, reqErr error, now time.Time) {
	e := cl.ep
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releaseLocked(cl, res.TTFT, res.Usage.CompletionTokens, v.class == llm.Retryable)
	switch {
	case v.unsent:
		if cl.probe {
			e.probing = false // nothing was sent: let another probe through
		}
	case v.class == llm.ServerDown:
		e.errors[v.class]++
		e.lastDown = reqErr.Error()
		d.counters.ServerDown++
		if e.tripBreaker(cl, now, d.cfg.BreakerCooldown) {
			d.log.Warn("breaker open", "endpoint", e.url, "err", reqErr, "cooldown", e.openUntil.Sub(now), "opens", e.opens)
		}
	case v.out == outRelease:
		if cl.probe {
			e.probing = false // cancelled probe: let another one through
		}
	default:
		if v.class != 0 {
			e.errors[v.class]++
		}
		if e.closeBreaker() { // the server answered
			d.log.Info("breaker closed", "endpoint", e.url)
		}
	}
}

// storeOp returns the store transition for verdict v, the lane the sample
// ends up in and a name for logs.
func (d *Dispatcher) storeOp(url string, l *lane, c store.Claimed, t *turn, v verdict, res llm.Result, reqErr error, now time.Time) (*lane, string, func(context.Context) error) {
	st, owner := d.cfg.Store, d.cfg.Owner
	switch v.out {
	case outComplete:
		r := storeResult(url, res, t.index, v.endReason)
		return l, "complete", func(ctx context.Context) error { return st.Complete(ctx, c.ID, owner, r) }
	case outNextTurn:
		r := storeResult(url, res, t.index, "")
		next := d.nextLane(c, t, res)
		target := l
		if next != "" {
			target = d.laneByName[next]
		}
		return target, "complete turn", func(ctx context.Context) error { return st.CompleteTurn(ctx, c.ID, owner, r, next) }
	case outReject:
		r := storeResult(url, res, t.index, "")
		return l, "reject", func(ctx context.Context) error { return st.Reject(ctx, c.ID, owner, r, v.check.Rule, v.check.Evidence) }
	case outEscalate:
		target := d.laneByName[l.cfg.EscalateTo]
		return target, "escalate", func(ctx context.Context) error { return st.Escalate(ctx, c.ID, owner, target.cfg.Name) }
	case outRelease:
		return l, "release", func(ctx context.Context) error { return st.Release(ctx, []string{c.ID}, owner) }
	case outRetry:
		delay := Delay(c.Attempts+1, d.cfg.BaseDelay, d.cfg.MaxDelay, rand.Float64())
		return l, "retry", func(ctx context.Context) error {
			return st.Retry(ctx, c.ID, owner, now.Add(delay), reqErr.Error())
		}
	}
	reason := reqErr.Error()
	if v.class != llm.BadRequest {
		reason = fmt.Sprintf("%d attempts, last: %s", c.Attempts+1, reason)
	}
	if c.Turn > 0 {
		reason = fmt.Sprintf("turn %d: %s", c.Turn, reason)
	}
	return l, "dead-letter", func(ctx context.Context) error { return st.DeadLetter(ctx, c.ID, owner, reason) }
}

// count records a stored outcome in the counters, and an answer's
// duration for the lane's ETA of the work in flight; d.mu is held.
func (d *Dispatcher) count(v verdict, res llm.Result, l, target *lane) {
	switch v.out {
	case outComplete, outNextTurn, outReject, outEscalate:
		l.durations.add(res.Duration)
	}
	switch v.out {
	case outComplete:
		d.counters.Done++
		if res.FinishReason == "length" {
			d.counters.Truncated++
		}
		if v.endReason != "" {
			d.counters.Ended++
		}
	case outNextTurn:
		d.counters.Turns++
		target.short = false
	case outReject:
		d.counters.Rejected++
	case outEscalate:
		d.counters.Escalated++
		target.short = false
	case outRelease:
		d.counters.Released++
		l.short = false
	case outRetry:
		d.counters.Retried++
	case outDead:
		d.counters.DeadLettered++
	}
}

// tripGuard stops Run: the configuration is poisoned. The samples the
// streak dead-lettered go back to pending, so nothing is lost to it.
func (d *Dispatcher) tripGuard(storeCtx context.Context, msg string) {
	pe := &PoisonError{Samples: d.guard.after, Message: msg, Params: mentionedParams(msg, d.cfg.Params)}
	err := d.storeDo(storeCtx, nil, func(ctx context.Context) error {
		var err error
		pe.Requeued, err = d.cfg.Store.RequeueDead(ctx, msg)
		return err
	})
	pe.RequeueOK = err == nil
	d.fatal(pe)
}

// response is the stored response record: the completion and where it ran.
type response struct {
	llm.Result
	Endpoint string `json:"endpoint"`
}

func storeResult(url string, res llm.Result, turn int, endReason string) store.Result {
	// Marshalling plain strings, ints and durations cannot fail.
	b, _ := json.Marshal(response{Result: res, Endpoint: url})
	return store.Result{
		Response:         b,
		FinishReason:     res.FinishReason,
		PromptTokens:     res.Usage.PromptTokens,
		CompletionTokens: res.Usage.CompletionTokens,
		Endpoint:         url,
		Duration:         res.Duration,
		TTFT:             res.TTFT,
		Turn:             turn,
		ReasoningTokens:  res.Usage.ReasoningTokens,
		EndReason:        endReason,
	}
}
