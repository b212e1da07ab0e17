package dispatch

import (
	"context"
	"errors"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// work sends one sample's current turn and records the outcome.
func (d *Dispatcher) work(workCtx, reqCtx, storeCtx context.Context, cl *call, l *lane, c store.Claimed) {
	e := cl.ep
	t, err := d.prepareTurn(c, cl.hist, cl.plan)
	if err != nil {
		cl.cancel(nil)
		d.settle(storeCtx, cl, l, c, nil, llm.Result{}, &llm.Error{Class: llm.BadRequest, Msg: "build request: " + err.Error()}, nil)
		return
	}
	if why := d.tooLong(reqCtx, e, c, t); why != "" {
		cl.cancel(nil)
		d.settle(storeCtx, cl, l, c, nil, llm.Result{}, &llm.Error{Class: llm.BadRequest, Msg: why}, nil)
		return
	}
	hedgeAt, hedgeStep := d.hedgeChunks(l, e)
	res, err, cause := d.send(reqCtx, cl, t, func(chunks int64) {
		if hedgeAt > 0 && chunks >= hedgeAt {
			hedgeAt += hedgeStep
			if d.tryHedge(workCtx, cl, l, t) {
				hedgeAt = 0
			}
		}
	})
	d.mu.Lock()
	h := cl.hedge
	d.mu.Unlock()
	if h != nil {
		if err == nil && res.FinishReason == "length" {
			d.settleFromHedge(storeCtx, cl, l, c, t, res, h)
			return
		}
		// The first answer decides the sample: the backup is not needed.
		h.cl.cancel(errHedgeDropped)
		<-h.done
	}
	d.settle(storeCtx, cl, l, c, t, res, err, cause)
}

// request is the chat request of t for call cl: the sample's turn, the
// lane's max_tokens, the job's settings and the token-id fields of the
// engine the server turned out to be, with the call's priority and
// routing key (admit.go).
func (d *Dispatcher) request(cl *call, t *turn) llm.Request {
	req := d.requestOn(cl.ep, cl.lane, t)
	if s := cl.ep.server.Load(); s != nil {
		req.Priority = priorityFor(s, cl.later)
	}
	req.RoutingKey = cl.routingKey
	return req
}

// requestOn is the chat request of t sent to endpoint e in lane l.
func (d *Dispatcher) requestOn(e *endpoint, l *lane, t *turn) llm.Request {
	req := llm.Request{Model: d.cfg.Model, Body: t.body, Members: t.members, MaxTokens: l.cfg.MaxTokens, Params: d.cfg.Params}
	if s := e.server.Load(); s != nil {
		req.TokenIDFields = s.TokenIDFields
	}
	return req
}

// send streams t's request for call cl in its lane, marks every chunk on
// the call and its endpoint (onChunk, when not nil, then sees the chunks so
// far), and reports the finished request to Observe. cause is why ctx
// ended, when the request failed.
func (d *Dispatcher) send(ctx context.Context, cl *call, t *turn, onChunk func(chunks int64)) (res llm.Result, err, cause error) {
	e, l := cl.ep, cl.lane
	req := d.request(cl, t)
	start := d.now()
	res, err = e.client.Chat(ctx, req, func(tokens int) {
		cl.streaming.Store(true)
		n := cl.generated.Add(int64(tokens))
		d.guard.accepted()
		e.lastToken.Store(d.now().UnixNano())
		e.tokens.Add(int64(tokens))
		e.streamChunks(cl, n)
		if onChunk != nil {
			onChunk(n)
		}
	})
	if err != nil {
		cause = context.Cause(ctx)
		cl.noProgress = errors.Is(err, llm.ErrNoProgress)
	} else {
		d.guard.accepted()
		e.completion.Add(int64(res.Usage.CompletionTokens))
		e.streamDone(cl, res.Usage.CompletionTokens)
	}
	cl.cancel(nil)
	d.observe(l.cfg.Name, e.url, start, res, err, cause)
	return res, err, cause
}
