package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2ENoHealthRoute: a server without /health (404, as some
// OpenAI-compatible servers have) is probed by GET /v1/models instead and
// gets its requests; status says which probe is in use (issue 21: it stayed
// DOWN "health probe: HTTP 404" for ever and never got a request).
func TestE2ENoHealthRoute(t *testing.T) {
	t.Parallel()
	srv := startAnswerServer(t, "The answer is four.")
	srv.noHealth.Store(true)
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 6)
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(ownJob(srv.url, 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := regen(t, dir, "run", "job.yaml")
	if run.code != 0 || !strings.Contains(run.stdout, "6 samples (6 done, 0 rejected, 0 dead)") {
		t.Fatalf("run against a server without /health: want exit 0 and 6 done\n%s", run)
	}
	const inUse = "health by GET /v1/models (GET /health: HTTP 404)"
	st := regen(t, dir, "status", "job.yaml")
	if !strings.Contains(st.stdout, inUse) {
		t.Errorf("status does not say which health probe is in use (%q):\n%s", inUse, st)
	}
	log, err := os.ReadFile(filepath.Join(dir, ".regen", "own", "regen.log"))
	if err != nil || !strings.Contains(string(log), "GET /v1/models") {
		t.Errorf("the log does not name the probe in use: %v\n%s", err, log)
	}
}
