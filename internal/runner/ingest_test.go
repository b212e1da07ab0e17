package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// twoFileJob is a job of two JSONL files in one partition.
func twoFileJob(t *testing.T) *job.Spec {
	t.Helper()
	dir := t.TempDir()
	writeRows(t, filepath.Join(dir, "data", "a.jsonl"), "a", 0, 30)
	writeRows(t, filepath.Join(dir, "data", "b.jsonl"), "b", 0, 20)
	return loadJobYAML(t, dir, `name: manifest
model: m
endpoints: [{url: "http://127.0.0.1:9"}]
sources: [{partition: p, path: data, prompt: prompt, id: id}]
`)
}

func writeRows(t *testing.T, path, prefix string, from, to int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		fmt.Fprintf(f, `{"id":"%s%03d","prompt":"item %d"}`+"\n", prefix, i, i)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func ingestOnce(t *testing.T, spec *job.Spec, st store.Store) IngestStats {
	t.Helper()
	stats, err := Ingest(context.Background(), spec, st)
	if err != nil {
		t.Fatal(err)
	}
	return stats
}

// TestIngestSkipsUnchangedFiles: a re-run reads only files that changed
// since their complete ingest (content, modification time or the mapping).
func TestIngestSkipsUnchangedFiles(t *testing.T) {
	spec := twoFileJob(t)
	st := openStore(t, spec)
	check := func(step string, got, want IngestStats) {
		t.Helper()
		if got != want {
			t.Errorf("%s: stats %+v, want %+v", step, got, want)
		}
	}
	check("first ingest", ingestOnce(t, spec, st), IngestStats{Read: 50, Inserted: 50, Files: 2})
	check("re-run", ingestOnce(t, spec, st), IngestStats{Read: 50, Unread: 50, Files: 2, Skipped: 2})

	// Rows appended to a: only a is read again, and only its new rows are new.
	a := filepath.Join(spec.Dir, "data", "a.jsonl")
	writeRows(t, a, "a", 30, 35)
	appended := ingestOnce(t, spec, st)
	check("after appending to a", appended, IngestStats{Read: 55, Unread: 20, Inserted: 5, Files: 2, Skipped: 1})
	if want := "55 rows: 35 read, 20 not read again (1 file unchanged since the last ingest): 5 new samples, 50 already stored,"; !strings.HasPrefix(appended.String(), want) {
		t.Errorf("summary after the append %q, want it to start %q", appended.String(), want)
	}
	check("re-run after the append", ingestOnce(t, spec, st), IngestStats{Read: 55, Unread: 55, Files: 2, Skipped: 2})

	// Same bytes, new modification time: read again, nothing new.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(spec.Dir, "data", "b.jsonl"), later, later); err != nil {
		t.Fatal(err)
	}
	check("after touching b", ingestOnce(t, spec, st), IngestStats{Read: 55, Unread: 35, Files: 2, Skipped: 1})

	// A different mapping yields different samples from the same bytes.
	spec.Sources[0].System = "You are terse."
	stats := ingestOnce(t, spec, st)
	check("after changing the mapping", stats, IngestStats{Read: 55, Files: 2})
	if !strings.Contains(stats.String(), "55 rows read: 0 new samples, 55 already stored") {
		t.Errorf("summary %q", stats.String())
	}
}

// TestIngestWaitsForAFileAnotherWorkerHolds: a file whose ingest lock
// another worker holds is left to it; this worker ingests the others and
// takes the file over once the lock is free and the file still incomplete
// (its holder died).
func TestIngestWaitsForAFileAnotherWorkerHolds(t *testing.T) {
	spec := twoFileJob(t)
	st := openStore(t, spec)
	p, _ := spec.Store.SQLitePath()
	other, err := sqlite.Open(p) // another worker's handle on the same store
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// The store names files relative to the job file.
	unlock, ok, err := other.TryLock(context.Background(), "ingest:p:"+filepath.Join("data", "a.jsonl"))
	if err != nil || !ok {
		t.Fatalf("take a's ingest lock: %v %v", ok, err)
	}
	done := make(chan IngestStats)
	go func() { done <- ingestOnce(t, spec, st) }()
	// b gets ingested meanwhile; a waits for its holder.
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, ok, err := st.SourceFile(context.Background(), "p", filepath.Join("data", "b.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		if ok && f.Complete {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b not ingested while a was locked")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case s := <-done:
		t.Fatalf("ingest ended while a was locked by another worker: %+v", s)
	case <-time.After(1500 * time.Millisecond):
	}
	if err := unlock(); err != nil { // the holder dies without completing a
		t.Fatal(err)
	}
	select {
	case s := <-done:
		if s.Inserted != 50 || s.Read != 50 {
			t.Errorf("stats %+v, want all 50 rows in after taking a over", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ingest did not take a over after its lock was released")
	}
}

// TestIngestCountsDuplicateIDs: a row whose id another row took is not
// merged silently; reading the same file again finds no new duplicate.
func TestIngestCountsDuplicateIDs(t *testing.T) {
	dir := t.TempDir()
	rows := `{"id": "a", "q": "first"}
{"id": "b", "q": "second"}
{"id": "a", "q": "a different question under a taken id"}
`
	if err := os.WriteFile(filepath.Join(dir, "p.jsonl"), []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Parse(filepath.Join(dir, "job.yaml"), []byte(`name: d
endpoints: [{url: "http://127.0.0.1:1"}]
sources: [{partition: p, path: p.jsonl, prompt: q, id: id}]
`))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(filepath.Join(dir, "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for run := range 2 {
		stats, err := Ingest(context.Background(), spec, st)
		if err != nil {
			t.Fatal(err)
		}
		wantNew := 2
		if run > 0 {
			wantNew = 0
		}
		if stats.Read != 3 || stats.Inserted != wantNew || stats.Duplicates != 1 {
			t.Errorf("ingest %d: %+v, want 3 read, %d new, 1 duplicate", run, stats, wantNew)
		}
		rows := "3 rows read"
		if run > 0 { // the manifest knows the file is in: it is not read again
			rows = "3 rows in 1 file unchanged since the last ingest, not read again"
		}
		want := fmt.Sprintf("%s: %d new samples, %d already stored, 0 bad rows (dead letters), 1 rows skipped because another row has their id (see regen stats)", rows, wantNew, 2-wantNew)
		if got := stats.String(); got != want {
			t.Errorf("ingest %d summary %q, want %q", run, got, want)
		}
	}
}

// TestIngestSummaryWording: the summary never says rows were read that
// were not (issue 21: "603 rows read ... 2 of 2 files ... not read again").
func TestIngestSummaryWording(t *testing.T) {
	tests := []struct {
		name  string
		stats IngestStats
		want  string
	}{
		{"all read", IngestStats{Read: 603, Inserted: 600, Bad: 3, Files: 2},
			"603 rows read: 600 new samples, 0 already stored, 3 bad rows (dead letters)"},
		{"none read", IngestStats{Read: 603, Unread: 603, Bad: 3, Files: 2, Skipped: 2},
			"603 rows in 2 files unchanged since the last ingest, not read again: 0 new samples, 600 already stored, 3 bad rows (dead letters)"},
		{"some read", IngestStats{Read: 55, Unread: 20, Inserted: 5, Files: 2, Skipped: 1},
			"55 rows: 35 read, 20 not read again (1 file unchanged since the last ingest): 5 new samples, 50 already stored, 0 bad rows (dead letters)"},
		{"others ingested all", IngestStats{Read: 50, Unread: 50, Files: 2, ByOthers: 2},
			"50 rows in 2 files ingested by other workers, not read again: 0 new samples, 50 already stored, 0 bad rows (dead letters)"},
		{"unchanged and by others", IngestStats{Read: 60, Unread: 40, Inserted: 20, Files: 3, Skipped: 1, ByOthers: 1},
			"60 rows: 20 read, 40 not read again (1 file unchanged since the last ingest, 1 file ingested by other workers): 20 new samples, 40 already stored, 0 bad rows (dead letters)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.stats.String(); got != tt.want {
				t.Errorf("summary\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestIngestSupersedesBadRowsOfACutRead: a file read while it was being
// written ends in half a row, a bad row; once the writer finished it, the
// file is read again and that row becomes a sample: its dead letter goes,
// so status and export no longer list it. A row still bad stays listed.
func TestIngestSupersedesBadRowsOfACutRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rows.jsonl")
	writeRows(t, path, "r", 0, 5)
	full := `{"id":"r005","prompt":"item 5"}` + "\n" + `{"id":"r006","prompt":"item 6"}` + "\n" + `{"id":"r007","prompt":` + "\n"
	cut := len(`{"id":"r005","prompt":"ite`)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(full[:cut]); err != nil {
		t.Fatal(err)
	}
	spec := loadJobYAML(t, dir, `name: cut
model: m
endpoints: [{url: "http://127.0.0.1:9"}]
sources: [{partition: p, path: rows.jsonl, prompt: prompt, id: id}]
`)
	st := openStore(t, spec)
	if got := ingestOnce(t, spec, st); got.Inserted != 5 || got.Bad != 1 {
		t.Fatalf("cut read: %+v, want 5 samples and the cut row bad", got)
	}
	if _, err := f.WriteString(full[cut:]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got := ingestOnce(t, spec, st)
	if got.Inserted != 2 || got.Bad != 1 {
		t.Errorf("read of the finished file: %+v, want 2 new samples and 1 bad row (line 8)", got)
	}
	errs, err := st.IngestErrors(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var origins []string
	for _, e := range errs {
		origins = append(origins, spec.Rel(e.Origin))
	}
	if want := []string{"rows.jsonl:8"}; strings.Join(origins, ",") != strings.Join(want, ",") {
		t.Errorf("bad rows recorded = %v, want %v (line 6, cut in the first read, is a sample now)", origins, want)
	}
	if n, err := st.IngestErrorCount(context.Background()); err != nil || n != 1 {
		t.Errorf("IngestErrorCount = %d, %v; want 1", n, err)
	}
}
