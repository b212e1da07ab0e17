package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/job"
)

// TestCaptureRetryDeadAndRecheck: captures that failed for good (the
// job expects 64 hidden, the server writes 16) stay dead on a plain
// re-run, whose error names --retry-dead; with the job fixed, --retry-dead
// captures them. A file changed on disk (a flipped byte) and one deleted
// make regen verify fail naming --recheck; --recheck captures exactly
// those two again and the next export verifies.
func TestCaptureRetryDeadAndRecheck(t *testing.T) {
	ctx := context.Background()
	jobPath := planCaptureJob(t, "hidden_states", 3)
	url := startCaptureSim(t, t.TempDir(), 1000, "")
	b, err := os.ReadFile(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(b), `endpoints: [{url: "http://127.0.0.1:2"}]`, `endpoints: [{url: "`+url+`"}]
  model: sim-model
  max_attempts: 1`, 1)
	write := func(s string) {
		if err := os.WriteFile(jobPath, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(yaml)
	var out bytes.Buffer
	o := captureOptions{}
	if err := runCapture(ctx, &out, jobPath, o); err == nil || !strings.Contains(err.Error(), "3 of 3 rows dead") || !strings.Contains(err.Error(), "regen capture --retry-dead job.yaml") {
		t.Fatalf("capture with the wrong hidden size: %v, want 3 dead and --retry-dead named\n%s", err, out.String())
	}
	write(strings.Replace(yaml, "hidden: 64", "hidden: 16", 1))
	if err := runCapture(ctx, &out, jobPath, o); err == nil || !strings.Contains(err.Error(), "3 of 3 rows dead") {
		t.Fatalf("plain re-run after the fix: %v; want the dead left dead", err)
	}
	out.Reset()
	o.retryDead = true
	if err := runCapture(ctx, &out, jobPath, o); err != nil || !strings.Contains(out.String(), "3 dead captures returned to pending") || !strings.Contains(out.String(), "3 captured now") {
		t.Fatalf("--retry-dead: %v\n%s", err, out.String())
	}
	if err := runExport(ctx, &bytes.Buffer{}, jobPath, exportOptions{}); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(spec.Capture.Dir, "*.safetensors"))
	if err != nil || len(files) != 3 {
		t.Fatalf("captured files %v (%v), want 3", files, err)
	}
	flipped, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	flipped[len(flipped)-2] ^= 0x01
	if err := os.WriteFile(files[0], flipped, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(files[1]); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = runVerify(ctx, &out, jobPath, verifyOptions{})
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "regen capture --recheck job.yaml") {
		t.Fatalf("verify after damage: %v, want exit 1 naming --recheck\n%s", err, out.String())
	}
	out.Reset()
	if err := runCapture(ctx, &out, jobPath, captureOptions{recheck: true}); err != nil ||
		!strings.Contains(out.String(), "2 captured files missing or changed, to capture again") || !strings.Contains(out.String(), "2 captured now") {
		t.Fatalf("--recheck: %v\n%s", err, out.String())
	}
	if err := runExport(ctx, &bytes.Buffer{}, jobPath, exportOptions{}); err != nil {
		t.Fatalf("export after --recheck: %v", err)
	}
	out.Reset()
	if err := runVerify(ctx, &out, jobPath, verifyOptions{}); err != nil || !strings.Contains(out.String(), "3 hidden-state files") {
		t.Fatalf("verify after --recheck: %v\n%s", err, out.String())
	}
}
