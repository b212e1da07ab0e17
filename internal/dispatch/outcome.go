package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
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
	outDefer // pending after a delay, no attempt spent (burn.go)
)

// verdict is the decision about one finished request.
type verdict struct {
	out       outcome
	class     llm.Class // the error's class, 0 for an answer
	check     quality.Verdict
	endReason string // outComplete before the plan's last turn: why
	unsent    bool   // no request could be built, so the endpoint saw nothing
	// A server-down error on a server that works (fault.go): alive keeps
	// the breaker closed; fault, when set, makes it the sample's with this
	// evidence (also a server error judged the sample's own, burn.go).
	alive bool
	fault string
	// refused: the poison guard counts the error; the sample goes back
	// without spending an attempt.
	refused bool
	// burnt: a server error judged the endpoint's (burn.go): the sample goes
	// back unspent; trip: it broke the endpoint.
	burnt, trip bool
	// goesOn: an escalated turn with more of its conversation after it,
	// which heads a chain of its own and is never held (chains.go).
	goesOn bool
}

// escalation is the verdict of turn t truncated in a lane that escalates.
func escalation(t *turn) verdict {
	return verdict{out: outEscalate, goesOn: t != nil && t.plan != nil && t.index+1 < t.plan.NumTurns()}
}

// decide maps a request's answer or error to an outcome; it is pure apart
// from reading the configuration.
func (d *Dispatcher) decide(l *lane, c store.Claimed, t *turn, res llm.Result, reqErr, cause error) verdict {
	switch {
	case reqErr == nil && res.FinishReason == "length" && l.cfg.EscalateTo != "":
		return escalation(t)
	case reqErr == nil:
		return d.judge(t, res)
	case releaseCause(cause):
		return verdict{out: outRelease}
	}
	class := llm.ClassOf(reqErr)
	switch class {
	case llm.ServerDown, llm.Backpressure:
		return verdict{out: outRelease, class: class}
	case llm.BadRequest:
		return verdict{out: outDead, class: class}
	}
	if c.Attempts+1 >= d.cfg.MaxAttempts {
		return verdict{out: outDead, class: class}
	}
	return verdict{out: outRetry, class: class}
}

// judge applies the quality rules and the conversation plan to an answer
// that stays in its lane.
func (d *Dispatcher) judge(t *turn, res llm.Result) verdict {
	if v := d.cfg.Quality.Check(quality.Request{Tools: t.tools, Reasoning: d.cfg.Reasoning}, res); v.Rejected() {
		return verdict{out: outReject, check: v}
	}
	ok, why := t.plan.Continue(t.index, res)
	if ok {
		return verdict{out: outNextTurn}
	}
	return verdict{out: outComplete, endReason: why}
}

// settle updates the endpoint, records the sample's fate in the store and
// frees its lane slot. t is nil when no request could be built. The render
// check of a stored answer runs under storeCtx (tokenizeTimeout bounds
// it): the drain's cancel must not turn good ids into "render check
// failed".
func (d *Dispatcher) settle(storeCtx context.Context, cl *call, l *lane, c store.Claimed, t *turn, res llm.Result, reqErr, cause error) {
	now := d.now()
	var v verdict
	if t == nil {
		v = verdict{out: outDead, class: llm.BadRequest, unsent: true}
	} else {
		v = d.refine(cl, c, d.contextCut(cl, l, t, res, d.decide(l, c, t, res, reqErr, cause)), reqErr, now)
	}
	d.settleEndpoint(cl, c.ID, v, res, reqErr, now)

	target, what, op := d.storeOp(storeCtx, cl.ep.url, l, c, t, v, res, reqErr, now)
	var hist *convHistory
	if v.out == outNextTurn {
		// Kept before the commit, which returns to a whole batch of turns
		// at once: a claim that follows it names this one too (keptFor).
		// A commit that fails drops the hold with it (turnDoneLocked), and
		// a claim that got the next turn before then does not use it
		// (convHistory.storedAnswer).
		hist = keptHistory(c, t, cl.held)
		d.mu.Lock()
		d.keepHistoryLocked(c.ID, cl.held, hist)
		d.mu.Unlock()
	}
	err := d.storeOutcome(storeCtx, c, what, op, now)
	hist.settle(err == nil) // before anything that may wait on the claim loop
	next := err == nil && v.out == outNextTurn
	d.mu.Lock()
	ctx := cl.est
	if u := res.Usage; u.PromptTokens > 0 {
		ctx = float64(u.PromptTokens + u.CompletionTokens)
	}
	d.turnDoneLocked(c.ID, cl.held, next, ctx, res.Usage, now)
	d.nextTurnInLocked(c.ID, cl.held, target)
	d.mu.Unlock()
	// The guard learns of a refusal before the sample leaves the books: its
	// budget counts requests in flight, and the claim loop wakes at once.
	refused := v.refused || (v.out == outDead && v.class == llm.BadRequest && t != nil)
	if err == nil && refused && d.guard.badRequest(c.ID, reqErr, cl.ep.url) {
		d.tripGuard(storeCtx, cl.ep.url, reqErr, v.refused)
	}
	if l.auto == nil {
		l.lim.Release()
	}
	d.retire(c, err, func() { d.count(v, res, l, target) })
	if err == nil && v.out == outDead {
		d.logDead(cl, c, v, reqErr)
	}
}

// refine applies what one request cannot tell alone: while the poison
// guard is armed, a refusal goes back unspent for the guard to count; a
// server-down error is judged an outage or the sample's fault (fault.go).
func (d *Dispatcher) refine(cl *call, c store.Claimed, v verdict, reqErr error, now time.Time) verdict {
	if v.class == 0 && v.out == outRelease {
		return v // cancelled by the dispatcher: nothing learned
	}
	if reqErr != nil && v.class != llm.BadRequest && d.guard.armed() && isRefusal(reqErr) && d.guard.refusedBy(cl.ep.url, d.urls()) {
		v.out, v.refused = outRelease, true
		return v
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	key, fault := serverFault(reqErr)
	fault = fault && d.cfg.BrokenStreak > 0
	if reqErr == nil {
		delete(d.faulted, c.ID)
	}
	if v.class != llm.ServerDown {
		delete(d.suspects, c.ID)
		if fault {
			return d.burnLocked(cl, c.ID, v, key, now)
		}
		return v
	}
	v = d.judgeDownLocked(cl, c.ID, v, now)
	switch {
	case fault && v.alive:
		// The server works (judgeCut): the failure counts in the streak but
		// breaks nothing, or the endpoint would read DOWN while it serves.
		cl.ep.streak.add(c.ID, key, now, cl.ep.okStart, d.cfg.BrokenStreak)
	case fault:
		// A server-down error that is the endpoint's (no headers, an empty
		// 200) counts toward breaking it; judgeCut still decides its attempt.
		d.judgeBurnLocked(cl, c.ID, key, now)
	}
	if v.fault != "" {
		v.out = outRetry
		if c.Attempts+1 >= d.cfg.MaxAttempts {
			v.out = outDead
		}
	}
	return v
}

// releaseCause reports whether the dispatcher cancelled a request to give
// its sample back without spending an attempt.
func releaseCause(cause error) bool {
	return errors.Is(cause, errPaused) || errors.Is(cause, errDrain) || errors.Is(cause, errMoved) || errors.Is(cause, errShed)
}

// storeOutcome writes a sample's outcome with op (decided at answered),
// logging a write that did not take.
func (d *Dispatcher) storeOutcome(storeCtx context.Context, c store.Claimed, what string, op func(context.Context) error, answered time.Time) error {
	err := d.storeDo(storeCtx, nil, op)
	switch {
	case errors.Is(err, store.ErrNotLeased), errors.Is(err, store.ErrWrongTurn):
		// The lease expired or was returned (this worker was paused or cut
		// off past dead_after) and the sample is someone else's now; its
		// outcome is theirs to record: this answer is dropped.
		d.mu.Lock()
		d.counters.LeaseLost++
		n := d.counters.LeaseLost
		d.mu.Unlock()
		d.log.Warn("lease lost; outcome dropped", "sample", c.ID, "op", what, "token", c.Token,
			"answered_ago", d.now().Sub(answered).Round(time.Millisecond), "leases_lost", n, "err", err)
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
	if d.held[c.ID] == c.Token {
		delete(d.held, c.ID)
	}
	if err == nil {
		counted()
	}
	d.mu.Unlock()
	d.signal()
}

// settleEndpoint updates the endpoint's error counts and breaker.
// Breaker transitions are logged; single failures only go to counters.
func (d *Dispatcher) settleEndpoint(cl *call, id string, v verdict, res llm.Result, reqErr error, now time.Time) {
	e := cl.ep
	d.mu.Lock()
	defer d.mu.Unlock()
	fixedBefore := e.fixedInflightLocked()
	d.releaseLocked(cl, res.TTFT, res.Usage.CompletionTokens, v.class == llm.Retryable)
	switch {
	case v.unsent:
		if cl.probe {
			e.probing = false // nothing was sent: let another probe through
		}
	case v.refused:
		e.errors[v.class]++
		e.lastDown = reqErr.Error()
		if cl.probe {
			e.probing = false
		}
	case v.burnt:
		e.errors[v.class]++
		e.lastDown = reqErr.Error()
		d.counters.Burnt++
		if e.brokenSince.IsZero() {
			if cl.probe {
				e.probing = false
			}
		} else if e.tripBreaker(cl, now, d.cfg.BreakerCooldown) && !v.trip {
			d.logs.log(d.log, slog.LevelWarn, "broken:"+e.url, "broken endpoint failed its probe", now,
				"endpoint", e.url, "cooldown", e.openUntil.Sub(now), "err", reqErr)
		}
	case v.class == llm.Backpressure:
		e.errors[v.class]++
		d.backpressureLocked(cl, fixedBefore, reqErr, now)
	case v.class == llm.ServerDown && v.alive:
		// One request's failure on a server that works: not an outage.
		e.errors[v.class]++
		d.counters.ServerDown++
		if e.closeBreaker() {
			d.log.Info("breaker closed", "endpoint", e.url)
		}
		d.logs.log(d.log, slog.LevelWarn, "fault:"+e.url, "request failed on a working server; endpoint stays open", now,
			"endpoint", e.url, "sample", id, "err", reqErr, "sample_fault", v.fault != "")
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
			if v.out != outDead { // a dead letter has its own line (logDead)
				d.logs.log(d.log, slog.LevelWarn, "retry:"+e.url, "request failed", now,
					"endpoint", e.url, "sample", id, "class", v.class.String(), "err", reqErr)
			}
		} else {
			e.servedAt, e.pressN = now, 0
			e.fixedCap = recoverCap(e.fixedCap, d.fixedLimitSum())
			d.answeredLocked(e, cl.start)
		}
		if e.closeBreaker() { // the server answered
			d.log.Info("breaker closed", "endpoint", e.url)
		}
	}
}

// storeOp returns the store transition for verdict v, the lane the sample
// ends up in and a name for logs. Every transition carries the claim's
// fencing token: it takes only under the lease this request ran under.
// ctx bounds the render check of an answer it stores (storeResult).
func (d *Dispatcher) storeOp(ctx context.Context, url string, l *lane, c store.Claimed, t *turn, v verdict, res llm.Result, reqErr error, now time.Time) (*lane, string, func(context.Context) error) {
	st, owner := d.cfg.Store, d.cfg.Owner
	commit := func(tr store.Transition) func(context.Context) error {
		tr.ID, tr.Owner, tr.Token = c.ID, owner, c.Token
		return func(ctx context.Context) error { return st.Commit(ctx, tr) }
	}
	switch v.out {
	case outComplete:
		r := d.storeResult(ctx, url, l, c, t, res, v.endReason)
		return l, "complete", commit(store.Transition{Op: store.OpFinish, State: store.Done, Result: r})
	case outNextTurn:
		r := d.storeResult(ctx, url, l, c, t, res, "")
		t.stored, t.storedAt, t.storedCtx = r.Response, r.Endpoint, priorContext(r)
		next := d.nextLane(c, t, res)
		target := l
		if next != "" {
			target = d.laneByName[next]
		}
		return target, "complete turn", commit(store.Transition{Op: store.OpTurn, Result: r, Lane: next})
	case outReject:
		r := d.storeResult(ctx, url, l, c, t, res, "")
		return l, "reject", commit(store.Transition{Op: store.OpFinish, State: store.Rejected, Result: r, Rule: v.check.Rule, Evidence: v.check.Evidence})
	case outEscalate:
		target := d.laneByName[l.cfg.EscalateTo]
		return target, "escalate", commit(store.Transition{Op: store.OpEscalate, Lane: target.cfg.Name})
	case outRelease:
		return l, "release", func(ctx context.Context) error { return st.Release(ctx, []string{c.ID}, owner) }
	case outDefer:
		// Not straight back to the server that failed it: other samples go
		// first, and their answers (or failures) tell whose fault it was.
		delay := Delay(1, d.cfg.BaseDelay, d.cfg.MaxDelay, 0.5+rand.Float64()/2)
		return l, "defer", commit(store.Transition{Op: store.OpDefer, NotBefore: now.Add(delay), LastError: reqErr.Error()})
	case outRetry:
		u := rand.Float64()
		if v.fault != "" {
			u = 0.5 + u/2 // at least half the ceiling: it must not hold the head of the queue
		}
		delay := Delay(c.Attempts+1, d.cfg.BaseDelay, d.cfg.MaxDelay, u)
		return l, "retry", commit(store.Transition{Op: store.OpRetry, NotBefore: now.Add(delay), LastError: reqErr.Error()})
	}
	reason := reqErr.Error()
	if v.class != llm.BadRequest {
		reason = fmt.Sprintf("%d attempts, last: %s", c.Attempts+1, reason)
	}
	if v.fault != "" {
		reason += " (the fault follows this sample: " + v.fault + ")"
	}
	if c.Turn > 0 {
		reason = fmt.Sprintf("turn %d: %s", conversation.Ordinal(c.Turn), reason)
	}
	return l, "dead-letter", commit(store.Transition{Op: store.OpDead, Reason: reason})
}

// count records a stored outcome in the counters, and an answer's
// duration for the lane's ETA of the work in flight; d.mu is held.
func (d *Dispatcher) count(v verdict, res llm.Result, l, target *lane) {
	switch v.out {
	case outComplete, outNextTurn, outReject, outEscalate:
		l.durations.add(res.Duration)
		l.answered++
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
		target.notePutBackLocked(false)
	case outReject:
		d.counters.Rejected++
	case outEscalate:
		d.counters.Escalated++
		l.escalated++
		target.short = false
		target.notePutBackLocked(!v.goesOn)
	case outRelease, outDefer:
		d.counters.Released++
		l.short = false
		l.notePutBackLocked(false)
	case outRetry:
		d.counters.Retried++
		l.notePutBackLocked(false)
	case outDead:
		d.counters.DeadLettered++
	}
}

// tripGuard stops Run: the configuration is poisoned. The samples the
// streak dead-lettered go back to pending, so nothing is lost to it; those
// it refused without dead-lettering (released) are pending already.
func (d *Dispatcher) tripGuard(storeCtx context.Context, url string, reqErr error, released bool) {
	msg := reqErr.Error()
	var le *llm.Error
	pe := &PoisonError{Samples: d.guard.streak(), Message: msg, Endpoint: url, Status: statusOf(reqErr), Params: mentionedParams(msg, d.cfg.Params),
		EndpointFault: errors.As(reqErr, &le) && le.EndpointFault}
	if released {
		pe.Requeued, pe.RequeueOK = pe.Samples, true
		d.fatal(pe)
		return
	}
	err := d.storeDo(storeCtx, nil, func(ctx context.Context) error {
		var err error
		pe.Requeued, err = d.cfg.Store.RequeueDead(ctx, msg)
		return err
	})
	pe.RequeueOK = err == nil
	d.fatal(pe)
}

// logDead writes a dead letter's log line, sent or not (a prompt too long
// for every context never is). Unlike a retry's, it is not rate-limited:
// a sample dies once, so the lines are bounded by the job's samples, and
// the log then accounts for every one with its reason.
func (d *Dispatcher) logDead(cl *call, c store.Claimed, v verdict, reqErr error) {
	d.mu.Lock()
	total := d.counters.DeadLettered
	d.mu.Unlock()
	args := []any{"endpoint", cl.ep.url, "sample", c.ID, "sent", !v.unsent}
	if !v.unsent {
		args = append(args, "attempts", c.Attempts+1)
	}
	args = append(args, "class", v.class.String(), "err", reqErr, "dead_letters", total)
	d.log.Warn("sample dead-lettered", args...)
}
