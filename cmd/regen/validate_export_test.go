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

func TestRunValidate(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := runValidate(&out, &errOut, "../../examples/demo/job.yaml"); err != nil {
		t.Fatalf("runValidate(demo) = %v; stderr:\n%s", err, errOut.String())
	}
	for _, want := range []string{"job.yaml: ok", "B1_glaive", "B2_opencode", "-> lane long", "sim on 127.0.0.1:any free port", "sharegpt, openai-batch, parquet"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}

	bad := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(bad, []byte("name: x\nsources: []\nlanes:\n  - name: a\n    max_tokens: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	err := runValidate(&out, &errOut, bad)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("runValidate(bad) = %v, want exit 1", err)
	}
	want := bad + ":2: sources: at least one source is required\n" +
		bad + ":5: lanes[0].max_tokens: must be > 0\n" +
		bad + ":1: endpoints: set endpoints (servers to call) or server (a server regen launches)\n" +
		bad + ": 3 problem(s)\n"
	if errOut.String() != want {
		t.Errorf("stderr = %q, want %q", errOut.String(), want)
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
	for _, name := range []string{"exp.openai-batch.jsonl", "exp.errors.jsonl", "exp.parquet", "exp.dead.jsonl"} {
		if _, err := os.Stat(filepath.Join(outDir, name)); err != nil {
			t.Errorf("missing %s: %v", name, err)
		}
	}
	if !strings.Contains(out.String(), "exported 1 done (0 truncated), 0 rejected, 0 dead, 0 bad source rows") {
		t.Errorf("summary = %q", out.String())
	}
}
