package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/regen-dev/regen/internal/testfs"
)

// TestE2EUnwritableOutput: an output folder the export could not write is
// found before any request, by run and by validate, naming the job file's
// output.dir and the path relative to the job file (issue 21: it was found
// after all generation). A 0555 folder does not stop root, so as root the
// read-only case is left out and the folder's parent is a regular file,
// which stops everyone.
func TestE2EUnwritableOutput(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { requests.Add(1) }))
	t.Cleanup(srv.Close)
	tests := []struct {
		name, outDir string
		want         []string // in run's and validate's message
		setup        func(t *testing.T, dir string)
	}{
		{"parent is a file", "blocker/out", []string{"job.yaml:11: output.dir: blocker/out: the output files cannot be written there (write into blocker: not a directory)"},
			func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, "blocker"), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}},
		{"read-only folder", "ro/out", []string{"job.yaml:11: output.dir: ro/out: the output files cannot be written there (create a file in ro: permission denied)"},
			func(t *testing.T, dir string) {
				if err := os.Mkdir(filepath.Join(dir, "ro"), 0o555); err != nil {
					t.Fatal(err)
				}
			}},
	}
	root := testfs.WritesReadOnlyDir(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "read-only folder" && root {
				t.Log("running as root: chmod 0555 does not stop root's writes; the parent-is-a-file case covers it")
				return
			}
			dir := t.TempDir()
			tt.setup(t, dir)
			job := ownJob(srv.URL, 2) + "  dir: " + tt.outDir + "\n"
			job = strings.Replace(job, "output: {formats: [sharegpt]}\n", "output:\n  formats: [sharegpt]\n", 1)
			must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "prompts.jsonl"), []byte(`{"id":"q1","question":"hi"}`+"\n"), 0o644))

			says := func(text string) bool {
				for _, w := range tt.want {
					if !strings.Contains(text, w) {
						return false
					}
				}
				return true
			}
			run := regen(t, dir, "run", "job.yaml")
			if run.code != 1 || !says(run.stderr) || strings.Contains(run.stderr, dir) {
				t.Errorf("run: want exit 1 and %q, no absolute path\n%s", tt.want, run)
			}
			if n := requests.Load(); n != 0 {
				t.Errorf("the server got %d requests before the output folder was checked, want 0", n)
			}
			if _, err := os.Stat(filepath.Join(dir, "own.db")); err == nil {
				t.Errorf("run created its store before finding the output folder unwritable")
			}
			val := regen(t, dir, "validate", "job.yaml")
			if val.code != 1 || !says(val.stderr) || !strings.Contains(val.stderr, "job.yaml: 1 problem(s)") {
				t.Errorf("validate: want exit 1 and %q as its one problem\n%s", tt.want, val)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 3 {
				t.Errorf("run and validate left %d entries in the job folder, want the 3 the test made", len(ents))
			}
		})
	}
}
