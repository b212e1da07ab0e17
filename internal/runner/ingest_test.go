package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

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
		want := fmt.Sprintf("3 rows read: %d new samples, %d already stored, 0 bad rows (dead letters), 1 rows skipped because another row has their id (see regen stats)", wantNew, 2-wantNew)
		if got := stats.String(); got != want {
			t.Errorf("ingest %d summary %q, want %q", run, got, want)
		}
	}
}
