package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// startupJob: line 2 is model:, line 4 the endpoint's url (line 5 its
// api_key_env when given), line 9 the monitor block.
const startupJob = `name: startup
model: %s
endpoints:
  - url: "%s"
    engine: %s%s
sources:
  - {partition: P, path: prompts.jsonl, prompt: question, id: id}
lanes: [{name: short, concurrency: 8, max_tokens: 64}]
monitor: {heartbeat_every: 200ms, dead_after: 2s, start_deadline: 3s}
`

func writeStartupJob(t *testing.T, model, url, engine, extra string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(startupJob, model, url, engine, extra)), 0o644); err != nil {
		t.Fatal(err)
	}
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 50)
	return dir
}

// checkStartupStop checks a run refused at start: exit 1 within limit,
// stderr saying each of want, and every sample pending with no attempt.
func checkStartupStop(t *testing.T, dir string, res result, limit time.Duration, want ...string) {
	t.Helper()
	t.Logf("exit %d after %s: %s", res.code, res.dur.Round(time.Millisecond), strings.TrimSpace(res.stderr))
	if res.code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", res.code, res)
	}
	if res.dur > limit {
		t.Errorf("stopped after %s, want within %s", res.dur.Round(time.Millisecond), limit)
	}
	for _, w := range want {
		if !strings.Contains(res.stderr, w) {
			t.Errorf("stderr does not say %q:\n%s", w, res.stderr)
		}
	}
	db := openStoreRO(t, filepath.Join(dir, "startup.db"))
	c, err := storeCounts(context.Background(), db)
	if err != nil || c["pending"] != 50 {
		t.Errorf("store states %v (%v), want all 50 pending", c, err)
	}
}

// TestE2EWrongModelVLLMSim: a vLLM-like simulator serving Qwen/Qwen3-8B
// and a job asking for Qwen/Qwen3-8b: refused at readiness, no request
// sent, exit 1 within seconds naming the model: line.
func TestE2EWrongModelVLLMSim(t *testing.T) {
	rs := startRecordingSim(t, map[string]any{"speed": 50, "load_time": 0, "warmup_time": 0, "engine": "vllm", "served_model_name": "Qwen/Qwen3-8B"})
	dir := writeStartupJob(t, "Qwen/Qwen3-8b", rs.url, "vllm", "")
	res := regen(t, dir, "run", "job.yaml")
	checkStartupStop(t, dir, res, 20*time.Second, `serves "Qwen/Qwen3-8B", not the job's model "Qwen/Qwen3-8b"`, "set model: at job.yaml:2",
		"every endpoint refuses the job's configuration")
	if n := len(rs.requests()); n != 0 {
		t.Errorf("%d chat requests sent, want none", n)
	}
}

// TestE2EStartupRefusals: a vLLM stand-in listing real-model, one asking
// for a key the job does not send (401 at /v1/models and for every
// request), and a wrong port: each stops the run with exit 1 and the job
// file's line.
func TestE2EStartupRefusals(t *testing.T) {
	standin := func(t *testing.T, needKey bool) (string, *atomic.Int64) {
		var chats atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if needKey && r.URL.Path != "/health" && r.Header.Get("Authorization") != "Bearer right" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"error":{"message":"Invalid API key"}}`)
				return
			}
			switch r.URL.Path {
			case "/health":
			case "/v1/models":
				fmt.Fprint(w, `{"object":"list","data":[{"id":"real-model"}]}`)
			case "/v1/chat/completions":
				chats.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, `{"object":"error","message":"The model `+"`wrong-model`"+` does not exist.","type":"NotFoundError","code":404}`)
			default:
				http.NotFound(w, r)
			}
		}))
		t.Cleanup(srv.Close)
		return srv.URL, &chats
	}
	t.Run("wrong model", func(t *testing.T) {
		url, chats := standin(t, false)
		dir := writeStartupJob(t, "wrong-model", url, "vllm", "")
		res := regen(t, dir, "run", "job.yaml")
		checkStartupStop(t, dir, res, 20*time.Second, `serves "real-model", not the job's model "wrong-model"`, "set model: at job.yaml:2")
		t.Logf("chat requests: %d", chats.Load())
	})
	t.Run("key refused", func(t *testing.T) {
		url, chats := standin(t, true)
		t.Setenv("STARTUP_TEST_KEY", "wrong")
		dir := writeStartupJob(t, "real-model", url, "vllm", "\n    api_key_env: STARTUP_TEST_KEY")
		res := regen(t, dir, "run", "job.yaml")
		checkStartupStop(t, dir, res, 20*time.Second, "refuses the job's credentials (HTTP 401 at /v1/models)",
			"endpoints[0].api_key_env at job.yaml:6")
		if n := chats.Load(); n != 0 {
			t.Errorf("%d chat requests got through, want none", n)
		}
	})
	t.Run("wrong port", func(t *testing.T) {
		url := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		dir := writeStartupJob(t, "m", url, "sglang", "")
		res := regen(t, dir, "run", "job.yaml")
		checkStartupStop(t, dir, res, 30*time.Second, "no endpoint answered in the 3s since the run started (monitor.start_deadline at job.yaml:9)",
			"never answered since the run started: is the url right? (endpoints[0].url at job.yaml:4)", "connection refused")
	})
	t.Run("accepts and never answers", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(srv.CloseClientConnections)
		dir := writeStartupJob(t, "m", srv.URL, "sglang", "")
		res := regen(t, dir, "run", "job.yaml")
		checkStartupStop(t, dir, res, 30*time.Second, "never answered since the run started: is the url right? (endpoints[0].url at job.yaml:4)")
	})
}
