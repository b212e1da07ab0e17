package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/testfs"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// captureJob writes a job with a capture section whose dir is capDir and
// a store holding n done samples of 200 prompt and 100 completion tokens.
func planCaptureJob(t *testing.T, capDir string, n int) string {
	t.Helper()
	dir := t.TempDir()
	jobPath := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobPath, []byte(`name: cap
model: m
endpoints: [{url: "http://127.0.0.1:1"}]
sources: [{partition: p, path: data.jsonl, prompt: prompt}]
lanes: [{name: short, concurrency: 8, max_tokens: 4096}]
output: {token_ids: true}
capture:
  endpoints: [{url: "http://127.0.0.1:2"}]
  dir: `+capDir+`
  layers: 2
  hidden: 64
  dtype: bf16
`), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := openStore(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var samples []store.NewSample
	for i := range n {
		samples = append(samples, store.NewSample{ID: fmt.Sprint(i), Partition: "p", Lane: "short", Body: []byte(`{"messages":[{"role":"user","content":"q"}]}`)})
	}
	if _, err := st.Ingest(ctx, samples); err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, "short", n, "me", time.Minute)
	if err != nil || len(claimed) != n {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	for _, c := range claimed {
		prompt, completion := sampleIDs(c.ID)
		resp, err := json.Marshal(map[string]any{"content": "a", "prompt_token_ids": prompt, "completion_token_ids": completion})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, c.ID, "me", store.Result{Response: resp, FinishReason: "stop", PromptTokens: 200, CompletionTokens: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return jobPath
}

// sampleIDs are planCaptureJob's token ids of sample id: 200 prompt ids
// and 100 completion ids, different for each sample.
func sampleIDs(id string) (prompt, completion []int32) {
	n, _ := strconv.Atoi(id)
	prompt, completion = make([]int32, 200), make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(1000 + n)
	}
	for i := range completion {
		completion[i] = int32(7 + i)
	}
	return prompt, completion
}

// sampleInput is the capture Input of sample id's conversation row.
func sampleInput(id string) string {
	p, c := sampleIDs(id)
	return tokenrows.InputHash(append(p, c...))
}

// TestPlanCaptureRefusesOnSmallTmpfs: `regen plan job.yaml` for a job with
// a capture section, without --model/--gpu, shows the capture estimate
// alone; on a 1 MB tmpfs 10 files of 300 tokens x 2 x 64 bf16 fit, 13 are
// refused with exit 1 and the numbers, in text and in JSON.
func TestPlanCaptureRefusesOnSmallTmpfs(t *testing.T) {
	fs := testfs.Tmpfs(t, 1<<20)
	ctx := context.Background()
	run := func(jobPath string, asJSON bool) (string, error) {
		o := planOptions{fromJob: jobPath, json: asJSON}
		var err error
		if o.capture, err = planCapture(ctx, jobPath); err != nil {
			t.Fatal(err)
		}
		if _, err := applyJob(ctx, &o, func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = runCapturePlan(o, &out)
		return out.String(), err
	}
	out, err := run(planCaptureJob(t, filepath.Join(fs, "ten"), 10), false)
	if err != nil || !strings.Contains(out, "10 files for 10 done samples, 3,000 tokens") || !strings.Contains(out, "estimate      795 kB") || !strings.Contains(out, "needs 834 kB with the 5% margin: fits") {
		t.Fatalf("10 files on 1 MB: error %v, output:\n%s", err, out)
	}
	big := planCaptureJob(t, filepath.Join(fs, "thirteen"), 13)
	out, err = run(big, false)
	var ee *exitError
	want := "refused: hidden-state capture needs 1.1 MB for 13 samples (3,900 tokens x 2 layers x 64 hidden x 2 bytes bf16, + 5% margin); " +
		filepath.Join(fs, "thirteen") + " has 1.0 MB free"
	if !errors.As(err, &ee) || ee.code != 1 || err.Error() != want || !strings.Contains(out, "REFUSED") {
		t.Fatalf("13 files on 1 MB: error %v, want exit 1 with %q; output:\n%s", err, want, out)
	}
	out, err = run(big, true)
	var doc struct {
		Capture struct {
			Estimate struct {
				Files     int   `json:"files"`
				Bytes     int64 `json:"bytes"`
				FreeBytes int64 `json:"free_bytes"`
			} `json:"estimate"`
			Fits bool `json:"fits"`
		} `json:"capture"`
	}
	if jerr := json.Unmarshal([]byte(out), &doc); jerr != nil || err == nil {
		t.Fatalf("--json: %v (exit error %v) in %s", jerr, err, out)
	}
	if c := doc.Capture; c.Fits || c.Estimate.Files != 13 || c.Estimate.Bytes != 13*(256+300*(8+2*64*2)) || c.Estimate.FreeBytes != 1<<20 {
		t.Errorf("--json capture = %+v", c)
	}
}
