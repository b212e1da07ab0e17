package probe

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/engine"
)

// standIn is an OpenAI-compatible server on loopback whose routes answer
// the given status (a route left out answers 404), recording each request.
type standIn struct {
	mu   sync.Mutex
	hits []string // "METHOD /path", in order
	body map[string]any
	auth string
}

func startStandIn(t *testing.T, routes map[string]int) (*standIn, string) {
	t.Helper()
	s := &standIn{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Method + " " + r.URL.Path
		s.mu.Lock()
		s.hits = append(s.hits, key)
		if r.Method == http.MethodPost {
			_ = json.NewDecoder(r.Body).Decode(&s.body)
			s.auth = r.Header.Get("Authorization")
		}
		s.mu.Unlock()
		code, ok := routes[key]
		if !ok {
			code = http.StatusNotFound
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// TestHealthCheckerFallback: a server without /health is probed by GET
// /v1/models, one without that either by a one-token completion; the probe
// found is kept (one extra request per missing route, once), and a
// fallback's own failure is a failure, not a reason to fall further.
func TestHealthCheckerFallback(t *testing.T) {
	tests := []struct {
		name     string
		routes   map[string]int
		want     []int // status of each of three checks
		probe    string
		why      string
		wantHits []string
	}{
		{"has /health", map[string]int{"GET /health": 200}, []int{200, 200, 200}, "GET /health", "",
			[]string{"GET /health", "GET /health", "GET /health"}},
		{"starting /health is not missing", map[string]int{"GET /health": 503, "GET /v1/models": 200}, []int{503, 503, 503}, "GET /health", "",
			[]string{"GET /health", "GET /health", "GET /health"}},
		{"no /health", map[string]int{"GET /v1/models": 200}, []int{200, 200, 200}, ProbeModels, "GET /health: HTTP 404",
			[]string{"GET /health", "GET /v1/models", "GET /v1/models", "GET /v1/models"}},
		{"/health wants another method", map[string]int{"GET /health": 405, "GET /v1/models": 200}, []int{200, 200, 200}, ProbeModels, "GET /health: HTTP 405",
			[]string{"GET /health", "GET /v1/models", "GET /v1/models", "GET /v1/models"}},
		{"models down after the fallback", map[string]int{"GET /v1/models": 503}, []int{503, 503, 503}, ProbeModels, "GET /health: HTTP 404",
			[]string{"GET /health", "GET /v1/models", "GET /v1/models", "GET /v1/models"}},
		{"completion only", map[string]int{"POST /v1/chat/completions": 200}, []int{200, 200, 200}, ProbeCompletion,
			"GET /health: HTTP 404, GET /v1/models: HTTP 404",
			[]string{"GET /health", "GET /v1/models", "POST /v1/chat/completions", "POST /v1/chat/completions", "POST /v1/chat/completions"}},
		{"nothing there", map[string]int{}, []int{404, 404, 404}, ProbeCompletion, "GET /health: HTTP 404, GET /v1/models: HTTP 404",
			[]string{"GET /health", "GET /v1/models", "POST /v1/chat/completions", "POST /v1/chat/completions", "POST /v1/chat/completions"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startStandIn(t, tt.routes)
			h := &HealthChecker{BaseURL: url + "/", Path: "/health", Model: "m1", APIKey: "k"}
			var got []int
			for range 3 {
				code, err := h.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, code)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("statuses (-want +got):\n%s", diff)
			}
			if probe, why := h.InUse(); probe != tt.probe || why != tt.why {
				t.Errorf("InUse() = %q, %q; want %q, %q", probe, why, tt.probe, tt.why)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if diff := cmp.Diff(tt.wantHits, s.hits); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			if tt.probe == ProbeCompletion && (s.body["model"] != "m1" || s.body["max_tokens"] != 1.0 || s.auth != "Bearer k") {
				t.Errorf("completion probe body %v, auth %q; want model m1, max_tokens 1, Bearer k", s.body, s.auth)
			}
		})
	}
}

// TestProbeWithNamesTheProbe: a snapshot says which probe gave its status.
func TestProbeWithNamesTheProbe(t *testing.T) {
	_, url := startStandIn(t, map[string]int{"GET /v1/models": 200})
	d, err := engine.Lookup("vllm")
	if err != nil {
		t.Fatal(err)
	}
	d.MetricsPath = "" // health only
	snap := ProbeWith(context.Background(), nil, url, d, &HealthChecker{BaseURL: url, Path: d.HealthPath})
	if !snap.Healthy() || snap.HealthProbe != ProbeModels || snap.HealthFallback != "GET /health: HTTP 404" {
		t.Errorf("snapshot: healthy %v, probe %q, fallback %q; want healthy by %s after GET /health: HTTP 404",
			snap.Healthy(), snap.HealthProbe, snap.HealthFallback, ProbeModels)
	}
	plain := Probe(context.Background(), nil, url, d)
	if plain.Healthy() || plain.HealthStatus != 404 || plain.HealthProbe != "GET /health" {
		t.Errorf("Probe without a checker: healthy %v, status %d, probe %q; want 404 from GET /health", plain.Healthy(), plain.HealthStatus, plain.HealthProbe)
	}
}
