package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/regen-dev/regen/internal/engine"
)

// readCapacity adds to m what the server says of its pools outside
// /metrics (docs/engines.md §13): SGLang's per-DP-rank pools and load
// (/v1/loads, else /server_info or /get_server_info), llama-server's
// slots and per-slot context (/props, else /v1/models), vLLM's max_model_len
// (/v1/models) and server load (/load). A route that does not answer
// leaves m as the scrape made it.
func readCapacity(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect, m *engine.Metrics) {
	if d.LoadsPath != "" {
		if ranks, err := sglangLoads(ctx, client, baseURL+d.LoadsPath); err == nil && len(ranks) > 0 {
			ranks.apply(m)
		} else {
			for _, path := range d.ServerInfoPaths {
				if ranks, err := sglangServerInfo(ctx, client, baseURL+path); err == nil && len(ranks) > 0 {
					ranks.apply(m)
					break
				}
			}
		}
	}
	if d.PropsPath != "" {
		if slots, slotCtx, err := llamaProps(ctx, client, baseURL+d.PropsPath); err == nil && slotCtx > 0 {
			m.Context = slotCtx
			m.Present |= engine.FieldContext
			if slots > 0 {
				m.Slots = slots
				m.Present |= engine.FieldSlots
			}
			if !m.Present.Has(engine.FieldMaxTotalTokens) {
				// Without a unified cache each slot gets n_ctx / slots of
				// the context, and /props reports that share: the slots
				// together hold the whole context.
				m.MaxTotalTokens = max(slots, 1) * slotCtx
				m.Present |= engine.FieldMaxTotalTokens
			}
		}
	}
	if d.ModelLimits {
		modelLimits(ctx, client, baseURL+engine.ModelsPath, m)
	}
	if d.LoadPath != "" && !m.Present.Has(engine.FieldRunning) {
		if n, err := serverLoad(ctx, client, baseURL+d.LoadPath); err == nil {
			m.Running = n
			m.Present |= engine.FieldRunning
		}
	}
}

// rank is one data-parallel rank's pool and load; -1 where unknown.
type rank struct {
	pool, running, waiting, usage float64
}

type ranks []rank

// apply makes the ranks the endpoint's truth: one endpoint whose pool is
// the sum of theirs and whose pressure is the fullest rank's (a request
// lands on one rank, and a full rank retracts whatever the others hold).
func (rs ranks) apply(m *engine.Metrics) {
	var pool, running, waiting, usage float64
	known := [4]bool{true, true, true, true}
	for _, r := range rs {
		for i, v := range []float64{r.pool, r.running, r.waiting, r.usage} {
			known[i] = known[i] && v >= 0
		}
		pool += r.pool
		running += r.running
		waiting += r.waiting
		usage = max(usage, r.usage)
	}
	m.Ranks = len(rs)
	set := func(ok bool, dst *float64, v float64, f engine.Field) {
		if ok {
			*dst = v
			m.Present |= f
		}
	}
	set(known[0] && pool > 0, &m.MaxTotalTokens, pool, engine.FieldMaxTotalTokens)
	set(known[1], &m.Running, running, engine.FieldRunning)
	set(known[2], &m.Queued, waiting, engine.FieldQueued)
	set(known[3], &m.TokenUsage, usage, engine.FieldTokenUsage)
}

// sglangLoads reads SGLang's GET /v1/loads: {"loads": [{dp_rank,
// num_running_reqs, num_waiting_reqs, max_total_num_tokens, token_usage,
// ...}], "aggregate": ...} (python/sglang/srt/entrypoints/v1_loads.py).
func sglangLoads(ctx context.Context, client *http.Client, url string) (ranks, error) {
	var body struct {
		Loads []struct {
			Running *float64 `json:"num_running_reqs"`
			Waiting *float64 `json:"num_waiting_reqs"`
			Pool    *float64 `json:"max_total_num_tokens"`
			Usage   *float64 `json:"token_usage"`
		} `json:"loads"`
	}
	if err := getJSON(ctx, client, url, &body); err != nil {
		return nil, err
	}
	out := make(ranks, 0, len(body.Loads))
	for _, l := range body.Loads {
		out = append(out, rank{orUnknown(l.Pool), orUnknown(l.Running), orUnknown(l.Waiting), orUnknown(l.Usage)})
	}
	return out, nil
}

// sglangServerInfo reads /server_info or /get_server_info: one entry per
// DP rank in internal_states, whose memory_usage.token_capacity is that
// rank's pool; older releases (and states without it) give only the
// top-level max_total_num_tokens, rank 0's.
func sglangServerInfo(ctx context.Context, client *http.Client, url string) (ranks, error) {
	var body struct {
		Pool   *float64 `json:"max_total_num_tokens"`
		States []struct {
			Memory struct {
				Capacity *float64 `json:"token_capacity"`
			} `json:"memory_usage"`
			Running *float64 `json:"running_batch_size"`
			Waiting *float64 `json:"waiting_queue_size"`
		} `json:"internal_states"`
	}
	if err := getJSON(ctx, client, url, &body); err != nil {
		return nil, err
	}
	var out ranks
	for _, st := range body.States {
		if st.Memory.Capacity == nil {
			out = nil
			break
		}
		out = append(out, rank{*st.Memory.Capacity, orUnknown(st.Running), orUnknown(st.Waiting), -1})
	}
	if len(out) == 0 && body.Pool != nil {
		out = ranks{{*body.Pool, -1, -1, -1}}
	}
	return out, nil
}

// llamaProps reads llama-server's /props: total_slots (--parallel) and
// default_generation_settings.n_ctx, one slot's context
// (tools/server/server-context.cpp, the props handler).
func llamaProps(ctx context.Context, client *http.Client, url string) (slots, slotCtx float64, err error) {
	var props struct {
		Slots    float64 `json:"total_slots"`
		Settings struct {
			NCtx float64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if err := getJSON(ctx, client, url, &props); err != nil {
		return 0, 0, err
	}
	return props.Slots, props.Settings.NCtx, nil
}

// modelLimits reads /v1/models for the most tokens a request may hold
// when nothing else said it: vLLM's max_model_len, llama-server's
// meta.n_ctx, which is one slot's context like /props' (meta.slot_n_ctx in
// its models handler, docs/engines.md §13.3), so it never caps the pool.
func modelLimits(ctx context.Context, client *http.Client, url string, m *engine.Metrics) {
	var list struct {
		Data []struct {
			MaxModelLen float64 `json:"max_model_len"`
			Meta        struct {
				NCtx float64 `json:"n_ctx"`
			} `json:"meta"`
		} `json:"data"`
	}
	if err := getJSON(ctx, client, url, &list); err != nil || len(list.Data) == 0 {
		return
	}
	card := list.Data[0]
	switch {
	case card.MaxModelLen > 0:
		m.Context = card.MaxModelLen
		m.Present |= engine.FieldContext
	case card.Meta.NCtx > 0 && !m.Present.Has(engine.FieldContext):
		m.Context = card.Meta.NCtx
		m.Present |= engine.FieldContext
	}
}

// Capacity reads what the server says of its pool and context outside
// /metrics (the routes readCapacity reads), for a server whose /metrics
// is off (llama-server without --metrics) and for the read made when an
// endpoint becomes ready, before its first request: the context is then
// known before any prompt is sent (docs/engines.md §13.3).
func Capacity(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect) engine.Metrics {
	if client == nil {
		client = http.DefaultClient
	}
	var m engine.Metrics
	readCapacity(ctx, client, strings.TrimRight(baseURL, "/"), d, &m)
	return m
}

// serverLoad reads vLLM's /load: {"server_load": N}.
func serverLoad(ctx context.Context, client *http.Client, url string) (float64, error) {
	var body struct {
		Load *float64 `json:"server_load"`
	}
	if err := getJSON(ctx, client, url, &body); err != nil {
		return 0, err
	}
	if body.Load == nil {
		return 0, fmt.Errorf("load %s: no server_load", url)
	}
	return *body.Load, nil
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	body, err := get(ctx, client, url, 16<<20)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", url, err)
	}
	return nil
}

func orUnknown(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}
