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

// finishedJob writes a job file with the given output block and a store
// holding two done samples (one cut at max_tokens) and one rejected as
// truncated; it returns the job file's path.
func finishedJob(t *testing.T, output string) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	src := "name: vj\nsources: [{partition: p, path: p.jsonl, prompt: q}]\nserver: {engine: sim}\n" + output
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var samples []store.NewSample
	for _, id := range []string{"p/a", "p/b", "p/c"} {
		samples = append(samples, store.NewSample{ID: id, Partition: "p", Lane: "default", Body: []byte(`{"messages":[{"role":"user","content":"hi ` + id + `"}]}`)})
	}
	if _, err := st.Ingest(ctx, samples); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, "default", 3, "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	answer := func(content, finish string) store.Result {
		res, _ := json.Marshal(llm.Result{Content: content, FinishReason: finish, Model: "served-model"})
		return store.Result{Response: res, FinishReason: finish}
	}
	if err := st.Complete(ctx, "p/a", "w", answer("hello there", "stop")); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, "p/b", "w", answer("cut sho", "length")); err != nil {
		t.Fatal(err)
	}
	if err := st.Reject(ctx, "p/c", "w", answer("also cut", "length"), "truncated", "finish_reason length"); err != nil {
		t.Fatal(err)
	}
	return path
}

// verifyExit runs runVerify and returns its exit code and output.
func verifyExit(t *testing.T, path string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	err := runVerify(context.Background(), &out, path, verifyOptions{})
	var ee *exitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.code, out.String() + ee.err.Error()
	}
	t.Fatalf("runVerify: %v", err)
	return 0, ""
}

// TestRunVerify: regen verify exits 0 on a fresh export and 1 after one
// bit of the ShareGPT file flipped, naming the file, the line and the
// sample; a later export writes the file again and it verifies.
func TestRunVerify(t *testing.T) {
	path := finishedJob(t, "output: {formats: [sharegpt, parquet]}\n")
	var out bytes.Buffer
	if err := runExport(context.Background(), &out, path, exportOptions{}); err != nil {
		t.Fatalf("runExport: %v", err)
	}
	// 7 files: the training files, their truncated files (the fixture's
	// cut answer), rejected, dead and the card.
	if !strings.Contains(out.String(), "verified: 7 files, ") {
		t.Errorf("export does not say it verified its files:\n%s", out.String())
	}
	if code, text := verifyExit(t, path); code != 0 || !strings.Contains(text, "ok: out/vj.manifest.json: 7 files, ") {
		t.Fatalf("verify a fresh export: exit %d\n%s", code, text)
	}
	file := filepath.Join(filepath.Dir(path), "out", "data", "vj.sharegpt.jsonl")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("hello there"))
	b[i+1] ^= 0x20 // "hello" -> "hEllo"
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, text := verifyExit(t, path)
	for _, want := range []string{
		"out/data/vj.sharegpt.jsonl: SHA-256 ",
		"out/data/vj.sharegpt.jsonl line 1 (p/a): differs from the store's current answer at byte",
		"hEllo",
		"out/vj.manifest.json: 2 problems in 7 files checked",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("verify after a flipped bit does not say %q:\n%s", want, text)
		}
	}
	if code != 1 {
		t.Errorf("verify after a flipped bit: exit %d, want 1", code)
	}
	if err := runExport(context.Background(), &out, path, exportOptions{}); err != nil {
		t.Fatalf("runExport again: %v", err)
	}
	if code, text := verifyExit(t, path); code != 0 {
		t.Errorf("verify after a new export: exit %d\n%s", code, text)
	}
}

// TestRunExportKeepsEarlierFormats: after an export of three formats,
// `regen export --format parquet` leaves a manifest and a card that
// describe every file regen wrote, all current (issue 30 item 6).
func TestRunExportKeepsEarlierFormats(t *testing.T) {
	path := finishedJob(t, "output: {formats: [sharegpt, openai-batch, parquet]}\n")
	var out bytes.Buffer
	if err := runExport(context.Background(), &out, path, exportOptions{}); err != nil {
		t.Fatalf("runExport: %v", err)
	}
	out.Reset()
	if err := runExport(context.Background(), &out, path, exportOptions{formats: []string{"parquet"}}); err != nil {
		t.Fatalf("runExport --format parquet: %v", err)
	}
	if !strings.Contains(out.String(), "also wrote sharegpt, openai-batch again: an earlier export left them in out") {
		t.Errorf("export --format parquet does not say it rewrote the earlier formats:\n%s", out.String())
	}
	dir := filepath.Join(filepath.Dir(path), "out")
	m := readManifest(t, dir, "vj")
	listed := map[string]bool{}
	for _, f := range m.Files {
		listed[f.Path] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadDir(filepath.Join(dir, export.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	for _, e := range data {
		names = append(names, export.DataDir+"/"+e.Name())
	}
	for _, name := range names {
		if name != "vj.manifest.json" && !listed[name] {
			t.Errorf("%s is in out/ but not in the manifest %v", name, listed)
		}
	}
	card, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"data/vj.sharegpt.jsonl", "vj.openai-batch.jsonl", "data/vj.parquet"} {
		if !strings.Contains(string(card), f) {
			t.Errorf("the card does not list %s", f)
		}
	}
	if code, text := verifyExit(t, path); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, text)
	}
}

// TestRunExportUnknownFormat: a format regen does not write is refused
// once, with the valid ones (issue 30 item 8).
func TestRunExportUnknownFormat(t *testing.T) {
	path := finishedJob(t, "")
	var out bytes.Buffer
	err := runExport(context.Background(), &out, path, exportOptions{formats: []string{"jsonl"}})
	want := `--format "jsonl": unknown format (want sharegpt, openai-batch, parquet)`
	if err == nil || err.Error() != want {
		t.Errorf("export --format jsonl = %v, want %q", err, want)
	}
}

// TestExportSummaryTruncated: the summary's truncated count says what it
// counts, beside the rejects by rule (issue 30 item 8: "0 truncated" read
// beside 19 rejected as truncated).
func TestExportSummaryTruncated(t *testing.T) {
	path := finishedJob(t, "output: {formats: [sharegpt]}\n")
	var out bytes.Buffer
	if err := runExport(context.Background(), &out, path, exportOptions{}); err != nil {
		t.Fatalf("runExport: %v", err)
	}
	want := "exported 2 done (1 of them cut at max_tokens, kept because the truncated rule is off), 1 rejected (by rule: truncated 1), 0 dead, 0 bad source rows"
	if !strings.Contains(out.String(), want) {
		t.Errorf("summary lacks %q:\n%s", want, out.String())
	}
}
