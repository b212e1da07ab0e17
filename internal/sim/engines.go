package sim

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Engines the simulator imitates, and the API shapes it serves
// (docs/engines.md §13).
const (
	EngineSGLang   = "sglang"
	EngineVLLM     = "vllm"
	EngineLlamaCpp = "llamacpp"

	// ShapeCurrent serves today's routes and names: SGLang /v1/loads and
	// /server_info with per-rank internal_states; vLLM
	// kv_cache_usage_perc, num_requests_waiting_by_reason, /load and
	// max_model_len in /v1/models.
	ShapeCurrent = "current"
	// ShapePrevious serves the releases before them: SGLang only
	// /get_server_info with the top-level pool; vLLM gpu_cache_usage_perc
	// and a model card without max_model_len.
	ShapePrevious = "previous"
)

// slotted: llama-server's --parallel slots share --ctx-size (ContextLen),
// each its own n_ctx / slots without a unified cache. The pool is the
// whole context and the slots are the running limit, so the KV pool never
// retracts; a slot's context cuts an answer instead.
func (c *Config) slotted() {
	if c.Engine != EngineLlamaCpp {
		return
	}
	c.Slots = max(c.Slots, 1)
	c.KVTokens = c.ContextLen
	c.MaxTotalTokens = 0
	c.MaxRunningRequests = c.Slots
}

// slotContext is one slot's context (llama.cpp's n_ctx_seq), 0 for the
// other engines.
func (c *Config) slotContext() int {
	if c.Engine != EngineLlamaCpp {
		return 0
	}
	return c.ContextLen / max(c.Slots, 1)
}

// llamaRoutes serves llama-server's routes: /health, /props, /slots,
// /tokenize and an OpenAI model card owned by llamacpp whose meta.n_ctx is
// one slot's context, as /props' is (meta.slot_n_ctx in
// tools/server/server-context.cpp; docs/engines.md §7 and §13.3).
func (s *Server) llamaRoutes(h func(string, http.HandlerFunc)) {
	h("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if s.state.Load() != stateUp || s.sched.deadPub.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]any{"code": 503, "message": "Loading model", "type": "unavailable_error"}})
			return
		}
		writeJSON(w, 200, map[string]string{"status": "ok"})
	})
	h("GET /props", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{
			"default_generation_settings": map[string]any{"n_ctx": s.cfg.slotContext(), "params": map[string]any{"n_predict": -1}},
			"total_slots":                 s.cfg.Slots,
			"model_path":                  s.cfg.ModelPath,
			"build_info":                  "b7102-sim",
		})
	})
	h("POST /tokenize", s.handleLlamaTokenize)
	h("GET /slots", func(w http.ResponseWriter, r *http.Request) {
		st := s.sched.snap.Load()
		slots := make([]map[string]any, s.cfg.Slots)
		for i := range slots {
			slots[i] = map[string]any{"id": i, "n_ctx": s.cfg.slotContext(), "is_processing": i < st.running}
		}
		writeJSON(w, 200, slots)
	})
}

// llamaModelMeta is the meta object of llama-server's model card.
func (c *Config) llamaModelMeta() map[string]any {
	return map[string]any{"n_ctx": c.slotContext(), "n_ctx_train": c.ContextLen, "vocab_type": 2}
}

// llamaServerHeader names the server as llama-server's HTTP library does.
func llamaServerHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "llama.cpp")
		next.ServeHTTP(w, r)
	})
}

// slotRequest applies llama-server's rules to a prompt of tokens: one
// that does not fit a slot (`slot.task->n_tokens() >= slot.n_ctx`) is
// refused with exceed_context_size_error, prompt tokens alone; one that
// fits generates until max_tokens or until the slot's context is full,
// which ends the answer with finish_reason length
// (tools/server/server-context.cpp).
func (s *Server) slotRequest(in *genRequest, kind reqKind, tokens, slotCtx int, hash uint64, prefixes []prefixSeg,
	ids []int32, thinking bool, toolName []byte) (*request, bool, []byte, string) {
	if tokens >= slotCtx {
		return nil, false, nil, fmt.Sprintf("request (%d tokens) exceeds the available context size (%d tokens), try increasing it", tokens, slotCtx)
	}
	maxNew := slotCtx - tokens
	if in.MaxCompletionTokens != nil {
		maxNew = min(maxNew, *in.MaxCompletionTokens)
	} else if in.MaxTokens != nil {
		maxNew = min(maxNew, *in.MaxTokens)
	}
	if maxNew < 1 {
		return nil, false, nil, fmt.Sprintf("max_tokens must be at least 1, got %d.", maxNew)
	}
	return s.makeRequest(in, kind, tokens, maxNew, hash, prefixes, ids, thinking, toolName)
}

// badRequest answers 400 in the engine's error shape: llama-server's
// {"error": {code, message, type}} (format_error_response), else SGLang's
// and vLLM's OpenAI object.
func (s *Server) badRequest(w http.ResponseWriter, msg string) {
	if s.cfg.Engine != EngineLlamaCpp {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	typ := "invalid_request_error"
	if strings.Contains(msg, "exceeds the available context size") {
		typ = "exceed_context_size_error"
	}
	writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"code": 400, "message": msg, "type": typ}})
}

// llamaMetrics registers llama-server's names (all prefixed llamacpp:,
// docs/engines.md §7); the scheduler's other series stay unexposed.
func (m *metrics) llamaMetrics() {
	m.reg = prometheus.NewRegistry()
	g := func(name, help string) prometheus.Gauge {
		x := prometheus.NewGauge(prometheus.GaugeOpts{Name: "llamacpp:" + name, Help: help})
		m.reg.MustRegister(x)
		return x
	}
	c := func(name, help string) prometheus.Counter {
		x := prometheus.NewCounter(prometheus.CounterOpts{Name: "llamacpp:" + name, Help: help})
		m.reg.MustRegister(x)
		return x
	}
	m.running = g("requests_processing", "Number of requests processing.")
	m.queued = g("requests_deferred", "Number of requests deferred.")
	m.promptTokens = c("prompt_tokens_total", "Number of prompt tokens processed.")
	m.genTokens = c("tokens_predicted_total", "Number of generation tokens processed.")
}

// dpRanks splits the one scheduler's pool and load over the --dp ranks it
// presents (the simulator runs one scheduler: each rank gets an even
// share of the pool and of the requests, the first ranks the remainder).
func (s *Server) dpRanks(st *stats) []map[string]any {
	n := max(s.cfg.DP, 1)
	pool := s.cfg.kvTokens()
	out := make([]map[string]any, n)
	for i := range out {
		share := func(v int) int { return v/n + btoi(i < v%n) }
		rankPool, used := share(pool), share(st.used)
		out[i] = map[string]any{
			"dp_rank": i, "num_running_reqs": share(st.running), "num_waiting_reqs": share(st.waiting),
			"num_used_tokens": used, "max_total_num_tokens": rankPool,
			"token_usage": float64(used) / float64(max(rankPool, 1)), "gen_throughput": st.genThroughput / float64(n),
			"max_running_requests": s.cfg.maxRunning(),
		}
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// handleLoads is SGLang's GET /v1/loads (python/sglang/srt/entrypoints/v1_loads.py).
func (s *Server) handleLoads(w http.ResponseWriter, r *http.Request) {
	ranks := s.dpRanks(s.sched.snap.Load())
	running, waiting := 0, 0
	for _, rk := range ranks {
		rk["num_total_reqs"] = rk["num_running_reqs"].(int) + rk["num_waiting_reqs"].(int)
		running += rk["num_running_reqs"].(int)
		waiting += rk["num_waiting_reqs"].(int)
	}
	writeJSON(w, 200, map[string]any{
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "version": simSGLangVersion,
		"dp_rank_count": len(ranks), "loads": ranks,
		"aggregate": map[string]any{"total_running_reqs": running, "total_waiting_reqs": waiting, "total_reqs": running + waiting},
	})
}

// internalStates is /server_info's internal_states: one entry per DP
// rank; the previous shape carried no token_capacity.
func (s *Server) internalStates(st *stats) []any {
	out := []any{}
	for _, rk := range s.dpRanks(st) {
		state := map[string]any{"last_gen_throughput": rk["gen_throughput"]}
		if s.cfg.APIShape != ShapePrevious {
			state["memory_usage"] = map[string]any{"weight": 72.0, "kvcache": float64(rk["max_total_num_tokens"].(int)) * 70272 / 1e9,
				"token_capacity": rk["max_total_num_tokens"]}
			state["waiting_queue_size"] = rk["num_waiting_reqs"]
			state["running_batch_size"] = rk["num_running_reqs"]
			state["num_used_tokens"] = rk["num_used_tokens"]
			state["engine_paused"] = false
		}
		out = append(out, state)
	}
	return out
}

// handleVLLMLoad is vLLM's GET /load: the requests the server is working on.
func (s *Server) handleVLLMLoad(w http.ResponseWriter, r *http.Request) {
	st := s.sched.snap.Load()
	writeJSON(w, 200, map[string]int{"server_load": st.running + st.waiting})
}

const simSGLangVersion = "0.5.6-sim"
