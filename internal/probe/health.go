package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// Names of the fallback health probes, as status and logs show them.
const (
	ProbeModels     = "GET /v1/models"
	ProbeCompletion = "POST /v1/chat/completions (1 token)"
)

// HealthChecker checks one OpenAI-compatible server's health and keeps the
// probe that works. Some servers have no health route: one that answers
// 404 (or 405) to the dialect's health path is probed by GET /v1/models
// from then on, and one without that either by a one-token completion of
// Model. Finding the fallback costs one extra request per missing route,
// once. A HealthChecker is safe for concurrent use.
type HealthChecker struct {
	Client  *http.Client // nil: http.DefaultClient
	BaseURL string       // the server root
	Path    string       // the dialect's health path, e.g. /health
	Model   string       // the model the completion probe asks for
	APIKey  string       // sent as a Bearer token by the fallbacks, which a key guards

	mu    sync.Mutex
	using int    // index of the probe in use
	why   string // what made it fall back, "" while on the health path
}

// Check runs the probe in use, falling back to the next one while the
// current one's route does not exist; it returns the HTTP status of the
// probe that answered.
func (h *HealthChecker) Check(ctx context.Context) (int, error) {
	h.mu.Lock()
	at := h.using
	h.mu.Unlock()
	names := h.names()
	for {
		code, err := h.run(ctx, at)
		if err != nil || !missingRoute(code) || at == len(names)-1 {
			return code, err
		}
		h.mu.Lock()
		if h.using == at { // another Check may have moved on already
			h.using = at + 1
			if h.why != "" {
				h.why += ", "
			}
			h.why += fmt.Sprintf("%s: HTTP %d", names[at], code)
		}
		at = h.using
		h.mu.Unlock()
	}
}

// InUse names the probe in use and, for a fallback, why ("" on the
// dialect's health path).
func (h *HealthChecker) InUse() (probe, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.names()[h.using], h.why
}

func (h *HealthChecker) names() []string {
	return []string{"GET " + h.Path, ProbeModels, ProbeCompletion}
}

// missingRoute reports a status that says the route is not there, not that
// the server is unwell.
func missingRoute(code int) bool {
	return code == http.StatusNotFound || code == http.StatusMethodNotAllowed
}

func (h *HealthChecker) run(ctx context.Context, probe int) (int, error) {
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	base := strings.TrimRight(h.BaseURL, "/")
	if probe == 0 {
		return Health(ctx, client, base+h.Path)
	}
	method, url, body := http.MethodGet, base+"/v1/models", []byte(nil)
	if probe == 2 {
		method, url = http.MethodPost, base+"/v1/chat/completions"
		body, _ = json.Marshal(map[string]any{"model": h.Model, "max_tokens": 1,
			"messages": []map[string]string{{"role": "user", "content": "ping"}}})
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("health %s: %w", url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if h.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+h.APIKey)
	}
	return statusOf(client, req)
}
