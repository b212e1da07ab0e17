package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const refusalJob = `name: refusal
model: wrong-model
endpoints: [{url: "%s", engine: %s%s}]
sources:
  - {partition: P, path: prompts.jsonl, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 16, max_tokens: 256}
retry: {poison_after: %d, base_delay: 10ms, max_delay: 50ms}
monitor: {heartbeat_every: 200ms, dead_after: 2s}
`

func writeRefusalJob(t *testing.T, url, engine, extra string, poisonAfter, rows int) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(refusalJob, url, engine, extra, poisonAfter)), 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range rows {
		fmt.Fprintf(&b, `{"id": "q%03d", "question": "q%03d: what is %d squared?"}`+"\n", i, i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompts.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestE2ERefusingServer: `regen run` against a server that refuses every
// request (a model it does not serve, a missing key, a 500 to
// everything) stops within a few requests with a non-zero exit and the
// server's words (for a 404 the models it serves), and leaves every
// sample pending with no attempt spent.
func TestE2ERefusingServer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		body   string
		want   []string
	}{
		{"wrong model", 404, `{"error":{"message":"The model ` + "`wrong-model`" + ` does not exist."}}`,
			[]string{"The model `wrong-model` does not exist.", `serves "real-model"`, `the job asks for "wrong-model"`, "back to pending"}},
		{"missing key", 401, `{"error":{"message":"Missing bearer token"}}`, []string{"HTTP 401: Missing bearer token", "api_key_env"}},
		{"500 to everything", 500, `{"error":{"message":"Internal server error"}}`, []string{"HTTP 500: Internal server error", "check its log"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, chats := chatStandin(t, "real-model", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				fmt.Fprint(w, tt.body)
			})
			dir := writeRefusalJob(t, url, "sglang", "", 10, 200)
			res := regen(t, dir, "run", "job.yaml")
			t.Logf("stopped after %d requests, exit %d: %s", chats.Load(), res.code, strings.TrimSpace(res.stderr))
			if res.code == 0 {
				t.Fatalf("run against a refusing server exited 0:\n%s", res)
			}
			if n := chats.Load(); n == 0 || n > 30 {
				t.Errorf("requests before stopping = %d, want a few (1 to 30)", n)
			}
			for _, w := range tt.want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, res.stderr)
				}
			}
			db := openStoreRO(t, filepath.Join(dir, "refusal.db"))
			c, err := storeCounts(context.Background(), db)
			if err != nil || c["pending"] != 200 {
				t.Errorf("store states after the stop: %v (%v), want all 200 pending", c, err)
			}
			var spent int
			if err := db.QueryRow(`SELECT COALESCE(SUM(attempts), 0) FROM samples`).Scan(&spent); err != nil || spent != 0 {
				t.Errorf("attempts spent = %d (%v), want 0", spent, err)
			}
		})
	}
}

// TestE2ENothingDoneExitsNonZero: a job whose every sample is
// dead-lettered (the guard off, a server refusing every prompt with a
// 400) finishes and exports, but says so and exits non-zero.
func TestE2ENothingDoneExitsNonZero(t *testing.T) {
	t.Parallel()
	rs := startRecordingSim(t, map[string]any{"speed": 50, "load_time": 0, "warmup_time": 0,
		"error_count": 1_000_000, "error_status": 400, "error_message": "prompt refused"})
	dir := writeRefusalJob(t, rs.url, "sim", "", 0, 20)
	res := regen(t, dir, "run", "job.yaml")
	if res.code == 0 {
		t.Fatalf("a job with 0 of 20 done exited 0:\n%s", res)
	}
	for _, w := range []string{"20 dead", "no sample done"} {
		if !strings.Contains(res.stdout+res.stderr, w) {
			t.Errorf("output does not say %q:\n%s", w, res)
		}
	}
}
