package dispatch

import (
	"context"
	"errors"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// Escalation backups. A sample truncated in a lane runs again from the
// start in the lane it escalates to, so a late one costs the job two long
// requests end to end: the last such chain decides when the job ends. Once
// the store has no more work for either lane, the servers have room the
// claims no longer use, and a request that has generated BackupAt of its
// max_tokens gets a backup: the same turn, sent at once in the escalation
// lane. Which answer is kept follows the rule escalation already has, so
// the data is the same as without backups: the first request's answer if it
// ends within its max_tokens (the backup is then cancelled), the backup's
// answer, as the escalated attempt, if it is truncated. A backup that fails
// changes nothing: the sample escalates through the store as usual. It is
// the hedged request of "The Tail at Scale" (Dean and Barroso), sent only
// where the wait it saves is certain to be long and the room it takes idle.

// errHedgeDropped cancels a backup whose first request ended without
// being truncated.
var errHedgeDropped = errors.New("backup not needed: the first request ended within its max_tokens")

// hedgeStepTokens is how many more tokens a request generates between two
// looks at whether its backup can start, once it passed the threshold; a
// lane with a small max_tokens looks ten times before its end, so a store
// that runs short of work late in the request still gets its backup.
const hedgeStepTokens = 512

// hedge is the backup of one request.
type hedge struct {
	cl   *call // its request, in the escalation lane
	done chan struct{}
	// res and err are its answer, set before done is closed.
	res llm.Result
	err error
}

// hedgeChunks is, in streamed chunks of endpoint e, when a request of lane
// l may first get a backup and how often it looks again after that; 0
// when it never does.
func (d *Dispatcher) hedgeChunks(l *lane, e *endpoint) (at, step int64) {
	if l.cfg.EscalateTo == "" || l.cfg.BackupAt <= 0 || l.cfg.MaxTokens <= 0 {
		return 0, 0
	}
	d.mu.Lock()
	per := e.tokensPerChunkLocked()
	d.mu.Unlock()
	at = max(int64(l.cfg.BackupAt*float64(l.cfg.MaxTokens)/per), 1)
	every := min(float64(hedgeStepTokens), float64(l.cfg.MaxTokens)/10)
	return at, max(int64(every/per), 1)
}

// tryHedge starts a backup of primary when the store has no more work for
// its lane or the escalation lane (every sample ingested, the lanes' last
// claims came back short), Run is not stopping, and the escalation lane has
// room on some endpoint. It reports whether it did.
func (d *Dispatcher) tryHedge(workCtx context.Context, primary *call, l *lane, t *turn) bool {
	target := d.laneByName[l.cfg.EscalateTo]
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping || !d.ingestDone() || !l.short || !target.short || primary.hedge != nil {
		return false
	}
	if target.auto == nil && !target.lim.TryAcquire() {
		return false
	}
	est := primary.prompt + d.meanOutputLocked(target)
	e, probe := d.pickLocked(now, target, est, affinity{})
	if e == nil {
		if target.auto == nil {
			target.lim.Release()
		}
		return false
	}
	ctx, cancel := context.WithCancelCause(workCtx)
	h := &hedge{done: make(chan struct{})}
	h.cl = &call{ep: e, probe: probe, cancel: cancel, lane: target, start: now, est: est, prompt: primary.prompt, backup: true}
	d.acquireLocked(h.cl, now)
	primary.hedge = h
	d.counters.Backups++
	d.log.Info("backup started", "lane", target.cfg.Name, "endpoint", e.url, "beside_lane", l.cfg.Name,
		"beside_tokens", int(primary.tokensLocked()), "max_tokens", l.cfg.MaxTokens)
	d.workers.Add(1)
	go func() {
		defer d.workers.Done()
		d.runHedge(ctx, h, t)
	}()
	return true
}

// runHedge sends the backup request and frees its slot when it ends.
func (d *Dispatcher) runHedge(ctx context.Context, h *hedge, t *turn) {
	cl, target := h.cl, h.cl.lane
	res, err, cause := d.send(ctx, cl, t, nil)
	// The endpoint learns what any request teaches it (an answer closes its
	// breaker, a server-down error opens it); the sample's fate is the
	// first request's to decide.
	v := verdict{out: outComplete}
	switch {
	case err == nil:
	case releaseCause(cause) || errors.Is(cause, errHedgeDropped):
		v = verdict{out: outRelease}
	default:
		v = verdict{out: outRetry, class: llm.ClassOf(err)}
	}
	d.settleEndpoint(cl, "", v, res, err, d.now()) // a backup holds no sample of its own
	if target.auto == nil {
		target.lim.Release()
	}
	h.res, h.err = res, err
	close(h.done)
	d.signal()
}

// settleFromHedge settles a sample whose request in lane l was truncated
// while its backup ran: the first request's slot is freed at once, and the
// backup's answer, when it has one, is stored as the escalated attempt's
// (the sample moves to the escalation lane and completes there, exactly
// once). If the backup failed, the sample escalates through the store as if
// it had none.
func (d *Dispatcher) settleFromHedge(storeCtx context.Context, cl *call, l *lane, c store.Claimed, t *turn, res llm.Result, h *hedge) {
	target := h.cl.lane
	escalated := escalation(t)
	d.settleEndpoint(cl, c.ID, escalated, res, nil, d.now())
	// The conversation leaves admission whatever the backup brings: held
	// on, busy, it would count against its endpoint's pool for good; a
	// next turn is held again when it starts.
	d.mu.Lock()
	d.turnDoneLocked(c.ID, cl.held, false, 0, llm.Usage{}, d.now())
	d.mu.Unlock()
	if l.auto == nil {
		l.lim.Release()
	}

	<-h.done
	now := d.now()
	if h.err != nil {
		d.log.Debug("backup failed; escalating", "sample", c.ID, "err", h.err)
		_, what, op := d.storeOp(storeCtx, cl.ep.url, l, c, t, escalated, res, nil, now)
		err := d.storeOutcome(storeCtx, c, what, op, now)
		d.retire(c, err, func() { d.count(escalated, res, l, target) })
		return
	}
	v := d.decide(target, c, t, h.res, nil, nil)
	next, what, op := d.storeOp(storeCtx, h.cl.ep.url, target, c, t, v, h.res, nil, now)
	used := v.out != outEscalate
	if used {
		st, owner, commit := d.cfg.Store, d.cfg.Owner, op
		// Two transactions, safely: a sample left leased in the escalation
		// lane by a crash between them is redone there, as an escalated
		// sample would be.
		op = func(ctx context.Context) error {
			if err := st.Commit(ctx, store.Transition{Op: store.OpRelane, ID: c.ID, Owner: owner, Token: c.Token, Lane: target.cfg.Name}); err != nil {
				return err
			}
			return commit(ctx)
		}
	}
	// else the backup was truncated too and escalates further, from the
	// first lane straight to the one after the backup's: nothing of it is
	// stored.
	err := d.storeOutcome(storeCtx, c, what, op, now)
	d.retire(c, err, func() {
		// The first escalation put nothing back in the store: the lanes'
		// "no more work" stands.
		d.counters.Escalated++
		l.durations.add(res.Duration)
		l.answered++
		l.escalated++
		d.count(v, h.res, target, next)
		if used {
			d.counters.BackupsUsed++
			d.log.Info("backup answer stored", "sample", c.ID, "lane", target.cfg.Name, "endpoint", h.cl.ep.url)
		}
	})
}
