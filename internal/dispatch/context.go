package dispatch

import (
	"context"
	"fmt"
	"time"

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

// contextMargin: a prompt is refused unsent on its estimate (about 4
// bytes a token, source.estimateTokens) only when the estimate exceeds the
// context by this factor.
const contextMargin = 1.25

// tokenizeTimeout bounds the tokenizer request of one prompt near the
// limit; without an answer the prompt is sent and the server judges it.
const tokenizeTimeout = 10 * time.Second

// contextLocked is the context of e's server in tokens, 0 when unknown.
func (e *endpoint) contextLocked() float64 {
	if m := e.load.metrics; m.Present.Has(engine.FieldContext) && m.Context > 0 {
		return m.Context
	}
	return 0
}

// largestContext is the largest context of the endpoints, 0 while one is
// unknown (it may take any prompt).
func (d *Dispatcher) largestContext() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	largest := 0.0
	for _, e := range d.eps {
		n := e.contextLocked()
		if n == 0 {
			return 0
		}
		largest = max(largest, n)
	}
	return largest
}

// tooLong says why a sample's first prompt fits no endpoint's context, or
// "" when one may take it (or a context is unknown). The bytes/4 estimate
// under-rates digit-heavy text up to 4x (a 4,926-byte numeric prompt is
// 4,921 tokens), so a prompt whose request body could hold the context
// (a token is at least a byte) is counted by the server's tokenizer when
// its engine has one; only those prompts cost a request.
func (d *Dispatcher) tooLong(ctx context.Context, e *endpoint, c store.Claimed, t *turn) string {
	if t == nil || t.index != 0 || c.PromptTokens <= 0 {
		return ""
	}
	largest := d.largestContext()
	switch {
	case largest == 0:
		return ""
	case float64(c.PromptTokens) > contextMargin*largest:
		return fmt.Sprintf("prompt of about %d tokens exceeds the %.0f-token context of every endpoint (a request's prompt and completion must fit it); not sent",
			c.PromptTokens, largest)
	case float64(len(t.body)) < largest:
		return ""
	}
	s := e.server.Load()
	counter, ok := e.client.(TokenCounter)
	if s == nil || s.Tokenizer.Path == "" || !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	n, err := counter.CountTokens(ctx, s.Tokenizer.Path, s.Tokenizer.Chat, d.cfg.Model, t.body)
	if err != nil {
		d.log.Debug("tokenize failed", "endpoint", e.url, "sample", c.ID, "err", err)
		return ""
	}
	if float64(n) < largest {
		return ""
	}
	return fmt.Sprintf("prompt of %d tokens (counted by %s's POST %s) does not fit the %.0f-token context of any endpoint (a request's prompt and completion must fit it); not sent",
		n, s.Engine, s.Tokenizer.Path, largest)
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
