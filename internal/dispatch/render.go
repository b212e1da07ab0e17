package dispatch

import (
	"context"
	"fmt"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// Renderer is a Chatter that can also render a request into its prompt
// ids with the server's chat template, generating nothing
// (llm.Client.RenderChat); the render check uses it when the client has it.
type Renderer interface {
	RenderChat(ctx context.Context, path string, req llm.Request) ([]int32, error)
}

// checkRender compares the prompt ids a server returned with its render of
// the same request, where it offers a render route (Server.Render: vLLM's
// /v1/chat/completions/render, as speculators reads prompts and masks from
// it; docs/engines.md §15.1). The ids a turn row trains on are the
// returned ones; a render that disagrees means the server's template or
// tokenizer does not give them for these messages, so the turn's ids are
// marked unavailable with the first differing index (export puts its row
// with the rows without ids) and the mismatch is logged with the row id.
// A render that fails marks them unavailable too, with its error: ids the
// check could not vouch for are not exported as checked. The answer itself
// is kept (regenerating it would spend the GPU time again for ids alone),
// and the render is not retried: the lane slot waits on it, and a route
// that fails now tends to fail again at once. storeResult calls it for
// every answer it stores.
func (d *Dispatcher) checkRender(ctx context.Context, e *endpoint, l *lane, c store.Claimed, t *turn, res *llm.Result) {
	s := e.server.Load()
	r, ok := e.client.(Renderer)
	if s == nil || s.Render == "" || !ok || len(res.PromptTokenIDs) == 0 || res.TokenIDsUnavailable != "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	rendered, err := r.RenderChat(ctx, s.Render, d.requestOn(e, l, t))
	if err != nil {
		res.TokenIDsUnavailable = fmt.Sprintf("render check failed: turn %d's prompt ids could not be compared with the server's render of its messages (POST %s): %v",
			conversation.Ordinal(t.index), s.Render, err)
		d.log.Debug("render failed", "endpoint", e.url, "row", tokenrows.TurnRowID(c.ID, t.index), "err", err)
		return
	}
	at, detail := firstDifference(res.PromptTokenIDs, rendered)
	if at < 0 {
		return
	}
	res.TokenIDsUnavailable = fmt.Sprintf("turn %d's prompt ids differ from the server's render of its messages (POST %s) at index %d: %s",
		conversation.Ordinal(t.index), s.Render, at, detail)
	d.log.Warn("prompt ids differ from the render", "row", tokenrows.TurnRowID(c.ID, t.index), "index", at, "detail", detail, "endpoint", e.url)
}

// firstDifference is the first index where the returned and rendered ids
// differ, and what differs there; -1 when they are equal.
func firstDifference(returned, rendered []int32) (int, string) {
	for i := range min(len(returned), len(rendered)) {
		if returned[i] != rendered[i] {
			return i, fmt.Sprintf("id %d returned, %d rendered", returned[i], rendered[i])
		}
	}
	if len(returned) == len(rendered) {
		return -1, ""
	}
	return min(len(returned), len(rendered)), fmt.Sprintf("%d ids returned, %d rendered", len(returned), len(rendered))
}
