package probe

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/engine"
)

func dialect(t *testing.T, name string) engine.Dialect {
	t.Helper()
	d, err := engine.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestParseMetrics(t *testing.T) {
	all := engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldGenerationTokensTotal |
		engine.FieldPromptTokensTotal | engine.FieldRetractionsTotal
	tests := []struct {
		file   string
		engine string
		want   engine.Metrics
	}{
		{"sglang_metrics.txt", "sglang", engine.Metrics{
			Running: 67, Queued: 9, TokenUsage: 0.93, GenerationTokensTotal: 9876540, PromptTokensTotal: 12345678,
			RetractionsTotal: 4, MaxTotalTokens: 87437, Present: all | engine.FieldMaxTotalTokens,
		}},
		{"sglang_metrics_dp2_nocap.txt", "sglang", engine.Metrics{
			Running: 22, Queued: 3, TokenUsage: 0.57, GenerationTokensTotal: 5000,
			Present: engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldGenerationTokensTotal,
		}},
		// The pool from cache_config_info: 27000 blocks x 16 tokens.
		{"vllm_metrics.txt", "vllm", engine.Metrics{
			Running: 24, Queued: 3, TokenUsage: 0.875, GenerationTokensTotal: 1.84e6, PromptTokensTotal: 512000,
			RetractionsTotal: 2, MaxTotalTokens: 432000, Present: all | engine.FieldMaxTotalTokens,
		}},
		{"llamacpp_metrics.txt", "llamacpp", engine.Metrics{
			Running: 4, Queued: 1, GenerationTokensTotal: 3400, PromptTokensTotal: 1200,
			Present: engine.FieldRunning | engine.FieldQueued | engine.FieldGenerationTokensTotal | engine.FieldPromptTokensTotal,
		}},
	}
	for _, tt := range tests {
		f, err := os.Open(filepath.Join("testdata", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseMetrics(f, dialect(t, tt.engine).Metrics)
		f.Close()
		if err != nil {
			t.Fatalf("ParseMetrics(%s): %v", tt.file, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseMetrics(%s) mismatch (-want +got):\n%s", tt.file, diff)
		}
	}
}

// server serves a metrics fixture, a health status and optionally server info.
func server(t *testing.T, fixture string, health int, serverInfo string) *httptest.Server {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(health) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(body)
	})
	if serverInfo != "" {
		mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(serverInfo)) })
		mux.HandleFunc("GET /props", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(serverInfo)) })
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name        string
		engine      string
		fixture     string
		health      int
		serverInfo  string
		wantHealthy bool
		wantMax     float64
		wantRunning float64
	}{
		{"sglang healthy", "sglang", "sglang_metrics.txt", 200, "", true, 87437, 67},
		{"sglang server info fills the KV pool size", "sglang", "sglang_metrics_dp2_nocap.txt", 200, `{"max_total_num_tokens": 231120, "max_req_input_len": 262000}`, true, 231120, 22},
		{"sglang unhealthy", "sglang", "sglang_metrics.txt", 503, "", false, 87437, 67},
		{"vllm healthy", "vllm", "vllm_metrics.txt", 200, "", true, 432000, 24},
		{"llama.cpp props: 4 slots of a 65536-token context each", "llamacpp", "llamacpp_metrics.txt", 200, `{"default_generation_settings": {"n_ctx": 65536}, "total_slots": 4}`, true, 262144, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := server(t, tt.fixture, tt.health, tt.serverInfo)
			before := time.Now()
			snap := Probe(context.Background(), srv.Client(), srv.URL+"/", dialect(t, tt.engine))
			if snap.Healthy() != tt.wantHealthy || snap.HealthStatus != tt.health {
				t.Errorf("health = %d healthy %v (err %v), want %d healthy %v", snap.HealthStatus, snap.Healthy(), snap.HealthErr, tt.health, tt.wantHealthy)
			}
			if snap.MetricsErr != nil {
				t.Fatalf("metrics error: %v", snap.MetricsErr)
			}
			if snap.Metrics.MaxTotalTokens != tt.wantMax || snap.Metrics.Running != tt.wantRunning {
				t.Errorf("metrics max_total=%v running=%v, want %v %v", snap.Metrics.MaxTotalTokens, snap.Metrics.Running, tt.wantMax, tt.wantRunning)
			}
			if snap.Time.Before(before) || snap.URL != srv.URL {
				t.Errorf("snapshot time %v url %q, want >= %v and %q", snap.Time, snap.URL, before, srv.URL)
			}
		})
	}
}

func TestProbeTimeoutAndRefused(t *testing.T) {
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("garbage{{\n")) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer close(release)

	d := dialect(t, "sglang")
	d.ProbeTimeout = 100 * time.Millisecond
	snap := Probe(context.Background(), srv.Client(), srv.URL, d)
	if snap.HealthErr == nil || snap.Healthy() {
		t.Errorf("hung health: err=%v healthy=%v, want a timeout error", snap.HealthErr, snap.Healthy())
	}
	if snap.MetricsErr == nil {
		t.Errorf("garbage metrics: err=nil, want a parse error")
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	snap = Probe(context.Background(), nil, url, d)
	if snap.HealthErr == nil || snap.HealthStatus != 0 || snap.MetricsErr == nil {
		t.Errorf("refused: status=%d err=%v metricsErr=%v, want 0 and errors", snap.HealthStatus, snap.HealthErr, snap.MetricsErr)
	}
}

func BenchmarkParseMetricsSGLang(b *testing.B) {
	body, err := os.ReadFile(filepath.Join("testdata", "sglang_metrics.txt"))
	if err != nil {
		b.Fatal(err)
	}
	d, _ := engine.Lookup("sglang")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseMetrics(bytes.NewReader(body), d.Metrics); err != nil {
			b.Fatal(err)
		}
	}
}

// Each engine's version comes from its own route and field, as the
// engines answer them (docs/engines.md §12); an answer without the field
// is an error, not an empty version.
func TestVersion(t *testing.T) {
	tests := []struct {
		engine, path, body string
		want               string
		wantErr            bool
	}{
		{"sglang", "/get_server_info", `{"max_total_num_tokens": 231120, "version": "0.5.6.post2"}`, "0.5.6.post2", false},
		{"sim", "/get_server_info", `{"version": "0.5.6-sim"}`, "0.5.6-sim", false},
		{"vllm", "/version", `{"version": "0.11.0"}`, "0.11.0", false},
		{"llamacpp", "/props", `{"default_generation_settings": {"n_ctx": 4096}, "build_info": "b6123-abcdef1"}`, "b6123-abcdef1", false},
		{"vllm", "/version", `{"ver": "0.11.0"}`, "", true},
		{"sglang", "/get_server_info", `{"version": 5}`, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.engine+" "+tt.body, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET "+tt.path, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tt.body)) })
			srv := httptest.NewServer(mux)
			defer srv.Close()
			got, err := Version(context.Background(), srv.Client(), srv.URL+"/", dialect(t, tt.engine))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("Version = %q, %v; want %q (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
