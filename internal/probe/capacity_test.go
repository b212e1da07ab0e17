package probe

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/engine"
)

// recorded serves each route from a recorded payload under testdata
// (testdata/SOURCES.md says where each shape comes from); other routes 404.
func recorded(t *testing.T, routes map[string]string, header http.Header) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	for route, file := range routes {
		body, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		mux.HandleFunc("GET "+route, func(w http.ResponseWriter, r *http.Request) {
			for k, v := range header {
				w.Header()[k] = v
			}
			w.Write(body)
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// capacityView is the part of a scrape the capacity routes decide.
type capacityView struct {
	Pool, Running, Queued, Usage, Slots, Context float64
	Ranks                                        int
}

func view(m engine.Metrics) capacityView {
	return capacityView{m.MaxTotalTokens, m.Running, m.Queued, m.TokenUsage, m.Slots, m.Context, m.Ranks}
}

// TestCapacityConformance reads every engine's capacity routes, current and
// older shapes, from recorded payloads.
func TestCapacityConformance(t *testing.T) {
	tests := []struct {
		name   string
		engine string
		routes map[string]string
		want   capacityView
	}{
		{"sglang /v1/loads on a 2-rank DP server: pools summed, fullest rank's usage", "sglang",
			map[string]string{"/metrics": "sglang_metrics_dp2_nocap.txt", "/v1/loads": "sglang_v1_loads_dp2.json",
				"/server_info": "sglang_get_server_info_old.json"},
			capacityView{Pool: 231120, Running: 78, Queued: 9, Usage: 0.96, Ranks: 2}},
		{"sglang /server_info internal_states when /v1/loads is missing", "sglang",
			map[string]string{"/metrics": "sglang_metrics_dp2_nocap.txt", "/server_info": "sglang_server_info_dp2.json"},
			// The metrics' usage (0.57) stays: internal_states has none.
			capacityView{Pool: 231120, Running: 78, Queued: 9, Usage: 0.57, Ranks: 2}},
		{"sglang before /server_info: /get_server_info's top-level pool", "sglang",
			map[string]string{"/metrics": "sglang_metrics_dp2_nocap.txt", "/get_server_info": "sglang_get_server_info_old.json"},
			capacityView{Pool: 231120, Running: 22, Queued: 3, Usage: 0.57, Ranks: 1}},
		{"sglang DP metrics without the JSON routes: one pool per dp_rank, summed", "sglang",
			map[string]string{"/metrics": "sglang_metrics_dp2.txt"},
			capacityView{Pool: 231120, Running: 78, Usage: 0.96}},
		{"sglang metrics' pool without the JSON routes", "sglang",
			map[string]string{"/metrics": "sglang_metrics.txt"},
			capacityView{Pool: 87437, Running: 67, Queued: 9, Usage: 0.93}},
		{"vllm max_model_len from /v1/models", "vllm",
			map[string]string{"/metrics": "vllm_metrics.txt", "/v1/models": "vllm_models.json", "/load": "vllm_load.json"},
			capacityView{Pool: 432000, Running: 24, Queued: 3, Usage: 0.875, Context: 32768}},
		{"vllm with 2 data-parallel engines: one pool each, summed", "vllm",
			map[string]string{"/metrics": "vllm_metrics_dp2.txt"},
			capacityView{Pool: 864000, Running: 38, Queued: 5, Usage: 0.88}},
		{"older vllm: by-reason queue, gpu_cache_usage_perc, /load, no max_model_len", "vllm",
			map[string]string{"/metrics": "vllm_metrics_fallbacks.txt", "/v1/models": "vllm_models_old.json", "/load": "vllm_load.json"},
			capacityView{Running: 12, Queued: 4, Usage: 0.42}},
		// -c 16384 --parallel 8: /props and /v1/models both say 2,048, one
		// slot's context (issue 32: a cap by meta.n_ctx read 2,048).
		{"llama-server --parallel 8, split cache: pool = slots x per-slot n_ctx", "llamacpp",
			map[string]string{"/metrics": "llamacpp_metrics.txt", "/props": "llamacpp_props.json", "/v1/models": "llamacpp_models.json"},
			capacityView{Pool: 16384, Running: 4, Queued: 1, Slots: 8, Context: 2048}},
		{"llama-server whose /props does not answer: the context from meta.n_ctx, no pool", "llamacpp",
			map[string]string{"/metrics": "llamacpp_metrics.txt", "/v1/models": "llamacpp_models.json"},
			capacityView{Running: 4, Queued: 1, Context: 2048}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := recorded(t, tt.routes, nil)
			m, err := Metrics(context.Background(), srv.Client(), srv.URL, dialect(t, tt.engine))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, view(m)); diff != "" {
				t.Errorf("capacity mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	tests := []struct {
		name     string
		routes   map[string]string
		header   http.Header
		want     string
		evidence string
	}{
		{"llama-server by owned_by", map[string]string{"/v1/models": "llamacpp_models.json"}, nil, "llamacpp", "owned_by: llamacpp"},
		{"llama-server by its Server header", map[string]string{"/v1/models": "vllm_models_old.json"},
			http.Header{"Server": {"llama.cpp"}}, "llamacpp", "Server: llama.cpp"},
		{"vllm by owned_by", map[string]string{"/v1/models": "vllm_models.json"}, nil, "vllm", "owned_by: vllm"},
		{"sglang by /server_info", map[string]string{"/server_info": "sglang_server_info_dp2.json"}, nil, "sglang", "GET /server_info answered 200"},
		{"older sglang by /get_server_info", map[string]string{"/get_server_info": "sglang_get_server_info_old.json"}, nil, "sglang", "GET /get_server_info answered 200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := recorded(t, tt.routes, tt.header)
			got, evidence, err := Detect(context.Background(), srv.Client(), srv.URL)
			if err != nil || got != tt.want || evidence != tt.evidence {
				t.Errorf("Detect = %q, %q, %v; want %q, %q", got, evidence, err, tt.want, tt.evidence)
			}
		})
	}
	t.Run("a server that names nothing", func(t *testing.T) {
		srv := recorded(t, map[string]string{}, nil)
		if got, _, err := Detect(context.Background(), srv.Client(), srv.URL); err == nil {
			t.Errorf("Detect = %q, want an error", got)
		}
	})
}
