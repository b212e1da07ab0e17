package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestE2ECorruptSource: a source that cannot be read (a truncated gzip, a
// 0-byte Parquet file) stops the run with the file named; status says
// FAILED and what to fix, not "re-run to resume", since a re-run fails the
// same way. Once the file is fixed, a re-run finishes the job, the
// samples stored before kept.
func TestE2ECorruptSource(t *testing.T) {
	t.Parallel()
	srv := startAnswerServer(t, "The answer is four.")
	tests := []struct {
		name, file string
		bad        func(t *testing.T, path string)
		want       string // in the run's error
	}{
		{"truncated gzip", "more.jsonl.gz", func(t *testing.T, path string) {
			var b bytes.Buffer
			zw := gzip.NewWriter(&b)
			for i := range 2000 {
				fmt.Fprintf(zw, `{"id": "c%04d", "question": "c%04d: what is %d plus one?"}`+"\n", i, i, i)
			}
			zw.Close()
			if err := os.WriteFile(path, b.Bytes()[:b.Len()/2], 0o644); err != nil {
				t.Fatal(err)
			}
		}, "corrupt data: unexpected EOF"},
		{"0-byte parquet", "more.parquet", func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "empty file (0 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"job.yaml": ownJob(srv.url, 4, moreSource(tt.file))})
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 10)
			bad := filepath.Join(dir, tt.file)
			tt.bad(t, bad)
			for try := range 2 {
				res := regen(t, dir, "run", "job.yaml")
				// The file named relative to the job file (issue 21).
				if res.code != 1 || !strings.Contains(res.stderr, " "+tt.file) || strings.Contains(res.stderr, dir) || !strings.Contains(res.stderr, tt.want) {
					t.Fatalf("run %d on a bad source: want exit 1 naming %s (not %s) and %q\n%s", try+1, tt.file, bad, tt.want, res)
				}
				rep, sres := status(t, dir, "job.yaml")
				evidence := strings.Join(rep.Evidence, "; ")
				if rep.State != monitor.Failed || sres.code != 2 {
					t.Errorf("status after run %d: %s exit %d, want FAILED exit 2\n%s", try+1, rep.State, sres.code, sres)
				}
				fix := "source " + tt.file + " cannot be read: fix or replace it"
				if !strings.Contains(evidence, fix) || strings.Contains(evidence, "re-run to resume") {
					t.Errorf("status evidence %q: want %q and no 're-run to resume'", evidence, fix)
				}
			}
			// The fix: the source is a readable file.
			if err := os.Remove(bad); err != nil {
				t.Fatal(err)
			}
			fixed := strings.TrimSuffix(strings.TrimSuffix(tt.file, ".gz"), ".parquet")
			if !strings.HasSuffix(fixed, ".jsonl") {
				fixed += ".jsonl"
			}
			writePrompts(t, filepath.Join(dir, fixed), 5)
			writeFiles(t, dir, map[string]string{"job.yaml": ownJob(srv.url, 4, moreSource(fixed))})
			if res := regen(t, dir, "run", "job.yaml"); res.code != 0 || !strings.Contains(res.stdout, "15 done") {
				t.Errorf("run after the fix: want exit 0 and 15 done\n%s", res)
			}
		})
	}
}

// TestE2EDispatchDeadLetterOrigin: a prompt the server refuses with 400 (a
// 2 MB prompt) is dead-lettered at dispatch, and its dead letter names the
// row it came from, as a row dead-lettered at ingest does.
func TestE2EDispatchDeadLetterOrigin(t *testing.T) {
	t.Parallel()
	srv := startAnswerServer(t, "The answer is four.")
	srv.tooLong = 1 << 20
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"job.yaml": ownJob(srv.url, 4),
		"prompts.jsonl": `{"id": "q0", "question": "What is 2 plus 2?"}` + "\n" +
			`{"id": "q1", "question": "` + strings.Repeat("long ", 400_000) + `"}` + "\n" +
			`{"id": "q2", "question": 7}` + "\n",
	})
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 0 {
		t.Fatalf("run:\n%s", res)
	}
	var got []deadRow
	for _, raw := range readJSONL(t, filepath.Join(dir, "out", "own.dead.jsonl")) {
		var d deadRow
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		if d.Reason == "" {
			t.Errorf("dead letter %+v has no reason", d)
		}
		d.Reason = ""
		got = append(got, d)
	}
	src := "prompts.jsonl" // relative to the job file, wherever the job runs
	want := []deadRow{
		{ID: "P/q1", Partition: "P", Origin: src + ":2"},        // refused at dispatch
		{Partition: "P", Origin: src + ":3", Field: "question"}, // refused at ingest
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
}

// moreSource is partition C of file, for ownJob.
func moreSource(file string) string {
	return "  - {partition: C, path: " + file + ", prompt: question, id: id}\n"
}
