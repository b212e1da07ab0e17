package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// TestUpgradeFromSchema1 builds a store the way the first schema left it
// (done, rejected and pending samples with results) and opens it with
// this binary: the upgrade keeps every sample and result and fills the
// statistics from the results already stored.
func TestUpgradeFromSchema1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{migrations[0], `
INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin, state, attempts, created_at, finished_at) VALUES
	('a', 'p', 'short', '{"messages":[]}', 5, 'o:1', 'done', 1, 1, 60000000000),
	('b', 'p', 'short', '{"messages":[]}', 5, 'o:2', 'rejected', 1, 1, 60000000000),
	('c', 'p', 'long', '{"messages":[]}', 5, 'o:3', 'pending', 0, 1, NULL);
INSERT INTO results (sample_id, response, finish_reason, prompt_tokens, completion_tokens, endpoint, duration_ns, ttft_ns, reason, finished_at) VALUES
	('a', '{}', 'length', 10, 100, 'e', 1, 1, '', 60000000000),
	('b', '{}', 'stop', 20, 0, 'e', 1, 1, 'empty content', 120000000000);
PRAGMA user_version = 1;`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("build schema 1: %v", err)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open after upgrade: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	cells, err := s.StatCells(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.StatCell{{Partition: "p", Lane: "short", Requests: 2, Truncated: 1, Rejected: 1, PromptTokens: 30, CompletionTokens: 100}}
	if diff := cmp.Diff(want, cells); diff != "" {
		t.Errorf("StatCells after upgrade (-want +got):\n%s", diff)
	}
	rc, err := s.RejectCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]store.RejectCount{{Partition: "p", Lane: "short", Rule: "unnamed", N: 1}}, rc); diff != "" {
		t.Errorf("RejectCounts after upgrade (-want +got):\n%s", diff)
	}
	hist, err := s.ThroughputHistory(ctx)
	if err != nil || len(hist) != 2 || hist[0].CompletionTokens != 100 || hist[1].Requests != 1 {
		t.Errorf("ThroughputHistory after upgrade = %+v, %v; want two minutes", hist, err)
	}
	var rows []store.Row
	if err := s.Finished(ctx, func(r store.Row) error { rows = append(rows, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1].Rule != "unnamed" || rows[1].Reason != "empty content" || rows[0].Result.Turn != 0 {
		t.Errorf("Finished after upgrade = %+v", rows)
	}
	cs, err := s.Claim(ctx, "long", 1, "w", 60e9)
	if err != nil || len(cs) != 1 || cs[0].ID != "c" || cs[0].Turn != 0 {
		t.Fatalf("Claim after upgrade = %+v, %v", cs, err)
	}
	if err := s.Complete(ctx, "c", "w", store.Result{Response: []byte(`{}`), FinishReason: "stop", PromptTokens: 1, CompletionTokens: 2}); err != nil {
		t.Errorf("Complete after upgrade: %v", err)
	}
}
