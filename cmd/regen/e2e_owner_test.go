package main

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// storeSnapshot is every table's row count, the store's recorded owner
// and the newest event: what a refused job file must leave as it was.
func storeSnapshot(t *testing.T, path string) map[string]string {
	t.Helper()
	db := openStoreRO(t, path)
	out := map[string]string{}
	for _, table := range []string{"samples", "results", "turns", "ingest_errors", "ingest_duplicates", "source_files",
		"origins", "events", "heartbeats", "generations", "counts", "store_meta"} {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", table, err)
		}
		out[table] = fmt.Sprint(n)
	}
	for _, q := range []string{`SELECT coalesce(max(id), 0) FROM events`, `SELECT coalesce(group_concat(key || '=' || value, ';'), '') FROM store_meta`,
		`SELECT coalesce(max(time), 0) FROM heartbeats`} {
		var v string
		if err := db.QueryRow(q).Scan(&v); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		out[q] = v
	}
	db.Close()
	return out
}

// TestE2ETwoJobFilesOneStore: two job files with the same name in one
// folder resolve to one store. The first to run owns it; the second is
// refused by run, status and export with both job files named, and
// nothing is written to the store.
func TestE2ETwoJobFilesOneStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	copyTree(t, "testdata/badinput", dir)
	job, err := os.ReadFile(filepath.Join(dir, "job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), job, 0o644); err != nil {
		t.Fatal(err)
	}
	// b reads only the chats: a job of its own, under the same name.
	other := strings.Replace(string(job), "  - partition: P\n    path: prompts           # a directory: a.jsonl, b_huge.jsonl, empty.jsonl\n    prompt: question\n    id: id\n", "", 1)
	if other == string(job) {
		t.Fatal("the job file no longer has the P source this test removes")
	}
	if err := os.WriteFile(filepath.Join(dir, "b.yaml"), []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := regen(t, dir, "run", "a.yaml"); res.code != 0 {
		t.Fatalf("run a.yaml:\n%s", res)
	}
	db := filepath.Join(dir, "bad.db")
	before := storeSnapshot(t, db)
	exportBefore, err := os.ReadFile(filepath.Join(dir, "out", "bad.sharegpt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{{"run", "b.yaml"}, {"status", "b.yaml"}, {"export", "b.yaml"}} {
		res := regen(t, dir, args...)
		if res.code == 0 || !strings.Contains(res.stderr, "belongs to job file a.yaml") || !strings.Contains(res.stderr, "not to b.yaml") {
			t.Errorf("regen %s: want a refusal naming a.yaml and b.yaml\n%s", strings.Join(args, " "), res)
		}
		if strings.Contains(res.stdout, "ingest:") {
			t.Errorf("regen %s ingested:\n%s", strings.Join(args, " "), res.stdout)
		}
	}
	if diff := cmp.Diff(before, storeSnapshot(t, db)); diff != "" {
		t.Errorf("the refused job file changed the store (-before +after):\n%s", diff)
	}
	if after, err := os.ReadFile(filepath.Join(dir, "out", "bad.sharegpt.jsonl")); err != nil || string(after) != string(exportBefore) {
		t.Errorf("the refused job file changed a.yaml's export (err %v)", err)
	}
	// The owner goes on as before.
	if res := regen(t, dir, "run", "a.yaml"); res.code != 0 || !strings.Contains(res.stdout, "0 new samples") {
		t.Errorf("re-run of a.yaml after the refusal:\n%s", res)
	}
	res := regen(t, dir, "run", "b.yaml")
	t.Logf("b.yaml refused, exit %d: %s", res.code, strings.TrimSpace(res.stderr))
}

// TestE2EMovedJobFolder: a job folder moved whole (the job file beside its
// store, the folder renamed) is the same job: a re-run reads no file again,
// sends nothing, reports no duplicate id and lists each bad row once. The
// same holds for a store written by a regen that named source files
// absolute, moved before this regen first opened it.
func TestE2EMovedJobFolder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		absolute bool // rewrite the store as an earlier regen left it
	}{{"store with relative names", false}, {"store from before relative names", true}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			from := filepath.Join(root, "first", "job")
			copyTree(t, "testdata/badinput", from)
			if res := regen(t, from, "run", "job.yaml"); res.code != 0 {
				t.Fatalf("run:\n%s", res)
			}
			if tc.absolute {
				makeNamesAbsolute(t, filepath.Join(from, "bad.db"), from)
			}
			to := filepath.Join(root, "second", "moved")
			if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(from, to); err != nil {
				t.Fatal(err)
			}
			res := regen(t, to, "run", "job.yaml")
			if res.code != 0 || !strings.Contains(res.stdout, "not read again") || !strings.Contains(res.stdout, "0 new samples") ||
				strings.Contains(res.stdout, "skipped because another row has their id") {
				t.Errorf("re-run in the moved folder: want nothing read again, nothing new, no duplicate ids\n%s", res)
			}
			db := openStoreRO(t, filepath.Join(to, "bad.db"))
			var dups, bad int
			if err := db.QueryRow(`SELECT (SELECT count(*) FROM ingest_duplicates), (SELECT count(*) FROM ingest_errors)`).Scan(&dups, &bad); err != nil {
				t.Fatal(err)
			}
			if dups != 0 || bad != 11 {
				t.Errorf("store after the move: %d duplicate ids, %d bad rows; want 0 and 11", dups, bad)
			}
			db.Close()
			text := regen(t, to, "status", "job.yaml")
			if !strings.Contains(text.stdout, "bad source rows (dead letters at ingest): 11") || strings.Contains(text.stdout, "duplicate") {
				t.Errorf("status after the move: want 11 bad rows and no duplicates\n%s", text.stdout)
			}
			t.Logf("moved %s -> %s: %s", from, to, strings.TrimSpace(res.stderr))
		})
	}
}

// makeNamesAbsolute rewrites a store as regen before relative names left
// it: every source file named absolute under dir, no owner recorded.
func makeNamesAbsolute(t *testing.T, path, dir string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := dir + string(filepath.Separator)
	for _, q := range []string{
		`UPDATE origins SET prefix = ?1 || prefix`,
		`UPDATE source_files SET path = ?1 || path`,
		`UPDATE ingest_errors SET origin = ?1 || origin`,
		`UPDATE ingest_duplicates SET origin = ?1 || origin, first_origin = ?1 || first_origin`,
		`DELETE FROM store_meta`,
	} {
		var args []any
		if strings.Contains(q, "?1") {
			args = append(args, p)
		}
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
