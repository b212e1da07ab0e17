package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/regen-dev/regen/internal/store"
)

// TestSamplesQueryPlans pins the index each listing shape uses: a page of
// dead letters among 10^6 done samples must not walk the done ones.
func TestSamplesQueryPlans(t *testing.T) {
	s, _ := openTemp(t, Options{})
	for _, tc := range []struct {
		name string
		q    store.SampleQuery
		want string
	}{
		{"dead", store.SampleQuery{State: store.Dead}, "INDEX samples_dead (id>?)"},
		{"rejected in a partition", store.SampleQuery{State: store.Rejected, Partition: "A"}, "INDEX samples_"},
		{"partition", store.SampleQuery{Partition: "A"}, "INDEX samples_partition (partition=? AND id>?)"},
		{"done", store.SampleQuery{State: store.Done}, "INDEX samples_finished (id>?)"},
		{"leased", store.SampleQuery{State: store.Leased}, "INDEX samples_leased"},
		{"all", store.SampleQuery{}, "INDEX sqlite_autoindex_samples_1 (id>?)"},
	} {
		query, args, err := samplesQuery(tc.q)
		if err != nil {
			t.Fatal(err)
		}
		plan := explain(t, s.DB(), query, args...)
		if !strings.Contains(plan, tc.want) {
			t.Errorf("%s: plan %q does not contain %q", tc.name, plan, tc.want)
		}
		// Walking the leased partial index is bounded; walking samples is not.
		if strings.Contains(plan, "SCAN s;") || strings.HasSuffix(plan, "SCAN s") || strings.Contains(plan, "SCAN s USING INDEX sqlite_autoindex") {
			t.Errorf("%s: plan %q scans samples", tc.name, plan)
		}
	}
}

// TestUpgradeFromFirstSchema opens a file written with the first schema:
// it upgrades in place, keeps its samples and gains the history table.
func TestUpgradeFromFirstSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{migrations[0], "PRAGMA user_version = 1",
		`INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin, state, created_at)
			VALUES ('old-1', 'A', 'short', x'7b7d', 3, 'a.jsonl:1', 'pending', 1)`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("write a first-schema file: %v", err)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("open a first-schema file: %v", err)
	}
	defer s.Close()
	rows, err := s.Samples(ctx, store.SampleQuery{Partition: "A"})
	if err != nil || len(rows) != 1 || rows[0].ID != "old-1" || rows[0].Origin != "a.jsonl:1" {
		t.Fatalf("Samples after upgrade = %+v, %v; want old-1 from a.jsonl:1", rows, err)
	}
	now := time.Now().Truncate(time.Minute)
	if err := s.PutMinutes(ctx, []store.Minute{{Time: now, Worker: "w", Tokens: 5}}); err != nil {
		t.Fatalf("PutMinutes after upgrade: %v", err)
	}
	var v int
	if err := s.DB().QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("user_version = %d, %v; want %d", v, err, schemaVersion)
	}
}
