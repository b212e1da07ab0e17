package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const poisonJob = `name: poison
model: sim-model
endpoints: [{url: "%s", engine: sim}]
sources:
  - {partition: P, path: prompts.jsonl, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 150, max_tokens: 4096}
generation:
  extra: {top_k: 20.5}
monitor: {heartbeat_every: 200ms, dead_after: 2s}
`

// TestE2EPoisonGuard runs a demo-sized job against a simulator that
// refuses every request with the same 400, as a server refuses a
// generation parameter: the run stops after at most 20 requests, saying
// what the server said, and no sample is left dead.
func TestE2EPoisonGuard(t *testing.T) {
	t.Parallel()
	const msg = "1 validation error for ChatCompletionRequest: top_k: Input should be a valid integer, got a number with a fractional part"
	rs := startRecordingSim(t, map[string]any{"speed": 50, "load_time": 0, "warmup_time": 0,
		"error_count": 1_000_000, "error_status": 400, "error_message": msg})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(poisonJob, rs.url)), 0o644); err != nil {
		t.Fatal(err)
	}
	var rows strings.Builder
	for i := range 300 {
		fmt.Fprintf(&rows, `{"id": "q%03d", "question": "q%03d: what is %d squared?"}`+"\n", i, i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompts.jsonl"), []byte(rows.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	res := regen(t, dir, "run", "job.yaml")
	n := len(rs.requests())
	t.Logf("stopped after %d requests in %s; stderr: %s", n, res.dur.Round(1e6), strings.TrimSpace(res.stderr))
	if res.code == 0 {
		t.Fatalf("run against a server refusing everything exited 0:\n%s", res)
	}
	if n == 0 || n > 20 {
		t.Errorf("requests sent before stopping = %d, want 1 to 20", n)
	}
	for _, want := range []string{msg, `"top_k"`, "back to pending"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("the error does not say %q:\n%s", want, res.stderr)
		}
	}
	db := openStoreRO(t, filepath.Join(dir, "poison.db"))
	c, err := storeCounts(context.Background(), db)
	if err != nil || c["pending"] != 300 {
		t.Errorf("store states after the stop: %v (%v), want all 300 pending", c, err)
	}
	rep, st := status(t, dir, "job.yaml")
	if !strings.Contains(st.stdout, "top_k") || rep.Total.Dead != 0 {
		t.Errorf("status after the stop does not show the reason or counts dead samples (%d):\n%s", rep.Total.Dead, st.stdout)
	}
}
