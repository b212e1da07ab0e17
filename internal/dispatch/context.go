package dispatch

import (
	"fmt"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/quality"
	"github.com/regen-dev/regen/internal/store"
)

// A server's context (engine.Metrics.Context: llama-server's per-slot
// n_ctx, vLLM's max_model_len) bounds one request's prompt and completion
// together, whatever the lane. Two things follow (docs/engines.md §13):
// a prompt that cannot fit any endpoint is a dead letter before it is
// sent, and an answer the context cut short is not escalated to a bigger
// lane, which would be cut at the same place.

// contextMargin: a prompt is refused unsent only when its estimate (about
// 4 bytes a token, source.estimateTokens) exceeds the context by this
// factor; nearer ones are sent and the server judges them exactly.
const contextMargin = 1.25

// contextLocked is the context of e's server in tokens, 0 when unknown.
func (e *endpoint) contextLocked() float64 {
	if m := e.load.metrics; m.Present.Has(engine.FieldContext) && m.Context > 0 {
		return m.Context
	}
	return 0
}

// tooLong says why a sample's first prompt fits no endpoint's context, or
// "" when one may take it (or a context is unknown).
func (d *Dispatcher) tooLong(c store.Claimed, t *turn) string {
	if t == nil || t.index != 0 || c.PromptTokens <= 0 {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	largest := 0.0
	for _, e := range d.eps {
		n := e.contextLocked()
		if n == 0 {
			return ""
		}
		largest = max(largest, n)
	}
	if float64(c.PromptTokens) <= contextMargin*largest {
		return ""
	}
	return fmt.Sprintf("prompt of about %d tokens exceeds the %.0f-token context of every endpoint (a request's prompt and completion must fit it); not sent",
		c.PromptTokens, largest)
}

// contextCut judges an answer that stopped at length because the server's
// context was full (prompt + completion reach it, completion under the
// lane's max_tokens): as an answer of its lane, not an escalation, and a
// truncation rejection names the context as the cause.
func (d *Dispatcher) contextCut(cl *call, l *lane, t *turn, res llm.Result, v verdict) verdict {
	if v.out != outEscalate {
		return v
	}
	d.mu.Lock()
	n := cl.ep.contextLocked()
	d.mu.Unlock()
	u := res.Usage
	// llama-server stops a slot when prompt and completion fill it; one
	// token of slack covers a count that leaves the last position free.
	if n == 0 || float64(u.PromptTokens+u.CompletionTokens) < n-1 || (l.cfg.MaxTokens > 0 && u.CompletionTokens >= l.cfg.MaxTokens) {
		return v
	}
	why := fmt.Sprintf("cut by the server's context: prompt %d + completion %d tokens fill its %.0f-token context (max_tokens %d not reached); a bigger lane cannot help",
		u.PromptTokens, u.CompletionTokens, n, l.cfg.MaxTokens)
	d.log.Info("context cut", "endpoint", cl.ep.url, "lane", l.cfg.Name, "evidence", why)
	v = d.judge(t, res)
	if v.out == outReject && v.check.Rule == quality.RuleTruncated {
		v.check.Evidence = why
	}
	return v
}
