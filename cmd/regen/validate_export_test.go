package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// TestValidateGolden: validate's summary and problems, golden. The demo is
// ok with its sources looked at; a job with typos gets every one in one
// run; a job whose sources do not match says so with counts and fields; a
// source none of whose rows fits its mapping is a problem with the likely
// fix, found beside another source's setting error; a job exporting token
// ids from an engine that cannot return them is warned.
func TestValidateGolden(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, path string
		o          validateOptions
		code       int
	}{
		{"demo", "../../examples/demo/job.yaml", validateOptions{rows: 20}, 0},
		{"demo-offline", "../../examples/demo/job.yaml", validateOptions{offline: true}, 0},
		{"typos", "testdata/validate/typos.yaml", validateOptions{rows: 20}, 1},
		{"sources", "testdata/validate/sources.yaml", validateOptions{rows: 20}, 1},
		{"sources-offline", "testdata/validate/sources.yaml", validateOptions{offline: true}, 0},
		{"shapes", "testdata/validate/shapes.yaml", validateOptions{rows: 20}, 1},
		// A warning, not a problem: llama-server returns no token ids.
		{"token-ids", "testdata/validate/token-ids.yaml", validateOptions{offline: true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runValidate(ctx, &out, &errOut, tc.path, tc.o)
			code := 0
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
			} else if err != nil {
				t.Fatalf("runValidate: %v", err)
			}
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, errOut.String())
			}
			golden(t, "validate/"+tc.name+".golden", "stdout:\n"+out.String()+"stderr:\n"+errOut.String())
		})
	}
}

func TestRunExport(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	src := "name: exp\nsources: [{partition: p, path: p.jsonl, prompt: q}]\nserver: {engine: sim}\noutput: {formats: [sharegpt]}\n"
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runExport(ctx, &out, path, exportOptions{}); err == nil || !strings.Contains(err.Error(), "no store yet") {
		t.Fatalf("runExport without a store = %v, want a 'no store yet' error", err)
	}

	spec, err := job.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Ingest(ctx, []store.NewSample{{ID: "s1", Partition: "p", Lane: "default", Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, "default", 1, "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(llm.Result{Content: "hello", FinishReason: "stop"})
	if err := st.Complete(ctx, "s1", "w", store.Result{Response: res, FinishReason: "stop"}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	outDir := filepath.Join(dir, "elsewhere")
	if err := runExport(ctx, &out, path, exportOptions{formats: []string{export.FormatOpenAIBatch, export.FormatParquet}, out: outDir}); err != nil {
		t.Fatalf("runExport: %v", err)
	}
	for _, name := range []string{"exp.openai-batch.jsonl", "exp.errors.jsonl", "exp.parquet", "exp.rejected.jsonl", "exp.dead.jsonl"} {
		if _, err := os.Stat(filepath.Join(outDir, name)); err != nil {
			t.Errorf("missing %s: %v", name, err)
		}
	}
	if !strings.Contains(out.String(), "exported 1 done, 0 rejected, 0 dead, 0 bad source rows") {
		t.Errorf("summary = %q", out.String())
	}
}
