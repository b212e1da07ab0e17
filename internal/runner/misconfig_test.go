package runner

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
)

// refusingServer is a stand-in whose /health is green and which answers
// every chat request with status and body; it lists models at /v1/models
// when models is not empty.
func refusingServer(t *testing.T, status int, body, models string, chats *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health":
			w.WriteHeader(http.StatusOK)
		case r.URL.Path == "/v1/models" && models != "":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, models)
		case r.URL.Path == "/v1/chat/completions":
			chats.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A healthy server that refuses every request for the job's model (404),
// or its key (401), must neither dead-letter the dataset nor retry for
// ever: the run stops within a few requests with the server's message
// (and, for a 404, the models the server lists), and every sample is
// still pending with no attempt spent.
func TestRefusingServerStopsTheRun(t *testing.T) {
	tests := []struct {
		name   string
		engine string
		status int
		body   string
		models string
		want   []string
	}{
		{"wrong model, no model list", "vllm", 404,
			`{"object":"error","message":"The model 'wrong-name' does not exist.","type":"NotFoundError","param":"model","code":404}`, "",
			[]string{"The model 'wrong-name' does not exist.", "HTTP 404", "lists no models"}},
		{"wrong model, listed models", "sglang", 404,
			`{"error":{"message":"The model ` + "`wrong-name`" + ` does not exist."}}`, `{"object":"list","data":[{"id":"real-model"},{"id":"other-model"}]}`,
			[]string{"The model `wrong-name` does not exist.", `serves "real-model", "other-model", the job asks for "wrong-name"`}},
		{"bad key", "sglang", 401, `{"error":{"message":"Invalid API key"}}`, "",
			[]string{"Invalid API key", "HTTP 401", "api_key_env"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var chats atomic.Int64
			srv := refusingServer(t, tt.status, tt.body, tt.models, &chats)
			dir := t.TempDir()
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 40)
			spec := loadJobYAML(t, dir, fmt.Sprintf(`name: misconfig
model: wrong-name
endpoints: [{url: %q, engine: %s}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 8, max_tokens: 64}]
monitor: {heartbeat_every: 100ms, dead_after: 5s, stall_after: 60s}
`, srv.URL, tt.engine))
			st := openStore(t, spec)
			_, runErr := startRun(t, spec, st, true).wait(t, time.Minute)
			err := runErr
			if _, ok := errorsAs[*dispatch.PoisonError](err); !ok {
				t.Fatalf("run = %v, want the poison guard's stop", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if n := chats.Load(); n > 20 {
				t.Errorf("%d requests before stopping, want a few (at most 20)", n)
			}
			for _, row := range finishedRows(t, st) {
				t.Errorf("sample %s finished as %s: %s", row.ID, row.State, row.Reason)
			}
			claimed, err := st.Claim(context.Background(), "default", 100, "inspector", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			spent := 0
			for _, c := range claimed {
				spent += c.Attempts
			}
			if len(claimed) != 40 || spent != 0 {
				t.Errorf("%d samples pending with %d attempts spent, want 40 with 0", len(claimed), spent)
			}
			t.Logf("stopped after %d requests: %v", chats.Load(), runErr)
		})
	}
}
