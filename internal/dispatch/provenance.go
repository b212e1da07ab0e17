package dispatch

import (
	"context"
	"encoding/json"
	"maps"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// Server is what an endpoint's server reports itself to be; every answer
// it gives carries it (store.Provenance).
type Server struct {
	Engine  string // the engine kind (sglang, vllm, llamacpp, sim)
	Version string // as the server reports it; "" when it did not say
	// TokenIDFields are the request fields that ask this engine for token
	// ids (engine.Dialect.TokenIDFields), when the job exports them: they
	// follow the engine the server turned out to be, not the one assumed
	// before it answered.
	TokenIDFields []string
	// Tokenizer is the engine's tokenizer route, for the context check
	// of a prompt near the limit (tooLong); zero when it has none.
	Tokenizer engine.Tokenizer
	// Render is the server's chat render route (engine.Dialect.RenderPath)
	// when it offers one: each answer's prompt ids are checked against the
	// render of the request (render.go); "" = no check.
	Render string
	// Priority is how the server orders its queue by a request's
	// "priority" field (probe.Identity.Priority): 0 none, +1 higher
	// values first, -1 lower first. A held conversation's next turn is
	// sent with this value, every other request with 0 (admit.go).
	Priority int
}

// SetServer records what the server at url reports itself to be, for the
// answers it gives from now on (a restarted server may be another version).
func (d *Dispatcher) SetServer(url string, s Server) {
	if e, ok := d.epByURL[url]; ok { // fixed after New
		e.server.Store(&s)
	}
}

// sampling is the sampling parameters a lane's requests send: the job's
// generation settings and the lane's max_tokens, as one JSON object (keys
// sorted, so equal settings read the same).
func sampling(params map[string]json.RawMessage, maxTokens int) json.RawMessage {
	m := maps.Clone(params)
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	if maxTokens > 0 {
		m["max_tokens"], _ = json.Marshal(maxTokens)
	}
	b, _ := json.Marshal(m) // raw messages that were valid JSON when sent
	return b
}

// storeResult is the stored answer to t from the server at url in lane l.
// Every answer the store keeps is built here, so every one with token ids
// goes through the render check first (render.go), whichever path settled
// it (the first request, a backup); ctx bounds that check.
func (d *Dispatcher) storeResult(ctx context.Context, url string, l *lane, c store.Claimed, t *turn, res llm.Result, endReason string) store.Result {
	p := store.Provenance{Generation: d.cfg.Generation, Model: res.Model, SystemFingerprint: res.SystemFingerprint,
		Sampling: l.sampling, Seed: t.plan.Seed}
	if e, ok := d.epByURL[url]; ok {
		d.checkRender(ctx, e, l, c, t, &res)
		if s := e.server.Load(); s != nil {
			p.Engine, p.EngineVersion = s.Engine, s.Version
		}
	}
	return store.Result{
		Response:         reply.Encode(res, url, p),
		FinishReason:     res.FinishReason,
		PromptTokens:     res.Usage.PromptTokens,
		CompletionTokens: res.Usage.CompletionTokens,
		Endpoint:         url,
		Duration:         res.Duration,
		TTFT:             res.TTFT,
		Turn:             t.index,
		ReasoningTokens:  res.Usage.ReasoningTokens,
		EndReason:        endReason,
		Generation:       d.cfg.Generation,
	}
}
