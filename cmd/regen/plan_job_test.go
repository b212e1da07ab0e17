package main

import (
	"fmt"
	"strconv"
	"time"

	"bytes"
	"context"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLaunchFlags(t *testing.T) {
	got := launchFlags([]string{"--tp", "8", "--mem-fraction-static=0.85", "--enable-hierarchical-cache", "--hicache-size", "30", "--trust-remote-code"})
	want := map[string]string{"--tp": "8", "--mem-fraction-static": "0.85", "--enable-hierarchical-cache": "", "--hicache-size": "30", "--trust-remote-code": ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("launchFlags mismatch (-want +got):\n%s", diff)
	}
}

// A job's server section drives the plan: its hicache of 300 GB per rank on
// TP8 must be refused exactly as the flags would be.
func TestPlanFromJob(t *testing.T) {
	dir := t.TempDir()
	cfg, err := filepath.Abs("../../internal/plan/testdata/kimi-k2.5.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.jsonl"), []byte(`{"id":"1","prompt":"hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	jobYAML := `name: kimi
model: ` + cfg + `
server:
  engine: sglang
  args: [--tp, "8", --mem-fraction-static, "0.93", --enable-hierarchical-cache, --hicache-size, "300"]
sources:
  - partition: p
    path: data.jsonl
    prompt: prompt
    id: id
lanes:
  - {name: short, concurrency: 150, max_tokens: 10240}
  - {name: long, concurrency: 32, max_tokens: 16384}
`
	jobPath := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobPath, []byte(jobYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	o := planOptions{fromJob: jobPath, gpu: "RTX-PRO-6000", hostMem: "449GB", tp: 1, dp: 1, engine: "sglang", kvDtype: "auto", promptTokens: 1500, outputTokens: 4000}
	changed := func(name string) bool { return name == "gpu" || name == "host-mem" }
	notes, err := applyJob(context.Background(), &o, changed)
	if err != nil {
		t.Fatalf("applyJob: %v", err)
	}
	if o.tp != 8 || o.memFraction != 0.93 || o.hicacheSize != 300 || !o.hicache || o.model != cfg {
		t.Fatalf("options from job = tp %d, mem %.2f, hicache %d/%v, model %q", o.tp, o.memFraction, o.hicacheSize, o.hicache, o.model)
	}
	if len(o.lanes) != 2 || o.lanes[0] != "short:150:10240" || o.lanes[1] != "long:32:16384" {
		t.Errorf("lanes from job = %v", o.lanes)
	}
	if len(notes) != 0 {
		t.Errorf("notes = %v, want none for a job that never ran", notes)
	}
	var out bytes.Buffer
	err = runPlan(o, &out)
	if err == nil || !strings.Contains(err.Error(), "host") {
		t.Fatalf("runPlan error = %v, want a host cache refusal", err)
	}
	if !strings.Contains(out.String(), "2400") {
		t.Errorf("plan output does not show the 8 x 300 GB = 2400 GB total:\n%s", out.String())
	}
}

// A job that has run supplies its lanes' observed prompt and output lengths.
func TestPlanFromJobObservedLengths(t *testing.T) {
	dir := t.TempDir()
	jobPath := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobPath, []byte(`name: ran
model: m
endpoints: [{url: "http://127.0.0.1:1"}]
sources: [{partition: p, path: data.jsonl, prompt: prompt}]
lanes: [{name: short, concurrency: 8, max_tokens: 4096}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var samples []store.NewSample
	for i := range 20 {
		samples = append(samples, store.NewSample{ID: fmt.Sprint(i), Partition: "p", Lane: "short", Body: []byte(`{}`)})
	}
	if _, err := st.Ingest(ctx, samples); err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, "short", 20, "me", time.Minute)
	if err != nil || len(claimed) != 20 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	for _, c := range claimed {
		id, _ := strconv.Atoi(c.ID)
		if err := st.Complete(ctx, c.ID, "me", store.Result{Response: []byte(`{}`), FinishReason: "stop",
			PromptTokens: 100 * (id + 1), CompletionTokens: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	o := planOptions{fromJob: jobPath}
	notes, err := applyJob(ctx, &o, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	// prompts 100..2000: mean 1050, nearest-rank p95 = 19th of 20 = 1900.
	if want := []string{"short:8:4096:1050:1000:1900:1000"}; !cmp.Equal(o.lanes, want) {
		t.Errorf("lanes = %v, want %v", o.lanes, want)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "20 finished samples") {
		t.Errorf("notes = %v", notes)
	}
}

// TestPlanLlamaCpp: plan says what it supports for llama-server, whether
// asked by flag, by a job that launches llama-server, or given a GGUF file
// as the model (never read whole, never decoded as JSON).
func TestPlanLlamaCpp(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "qwen3-8b-q4_k_m.gguf")
	if err := os.WriteFile(gguf, append([]byte("GGUF"), make([]byte, 64)...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.jsonl"), []byte(`{"id":"1","prompt":"hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	jobYAML := "name: llama\nmodel: " + gguf + "\nserver:\n  engine: llamacpp\n  args: [-c, \"16384\", --parallel, \"8\"]\n" +
		"sources:\n  - {partition: p, path: data.jsonl, prompt: prompt, id: id}\n"
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(jobYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"plan", "--engine", "llamacpp", "--model", gguf, "--gpu", "RTX-PRO-6000"},
		{"plan", "--from-job", "job.yaml", "--gpu", "RTX-PRO-6000"},
		{"plan", "--model", gguf, "--gpu", "RTX-PRO-6000"},
	} {
		res := regen(t, dir, args...)
		if res.code == 0 || !strings.Contains(res.stderr, "it does not plan llama-server (llamacpp)") ||
			!strings.Contains(res.stderr, "the pool is slots x n_ctx") || strings.Contains(res.stderr, "invalid character") {
			t.Errorf("regen %s: exit %d, stderr %q; want a refusal that says what is supported", strings.Join(args, " "), res.code, res.stderr)
		}
	}
}
