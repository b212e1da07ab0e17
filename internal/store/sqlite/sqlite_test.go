package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "job.db"))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

func openTemp(t *testing.T, o Options) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.db")
	s, err := OpenWith(path, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func newSample(id, lane string) store.NewSample {
	return store.NewSample{ID: id, Partition: "p", Lane: lane, Body: []byte(`{"messages":[]}`), PromptTokens: 7, Origin: "p.jsonl:" + id}
}

// snapshot is everything a store can say about itself through its interface.
type snapshot struct {
	Counts       []store.Count
	Finished     []store.Row
	LastErrors   []store.Row
	IngestErrors []store.IngestError
	Events       []store.Event
	Heartbeat    store.Heartbeat
	HasHeartbeat bool
	Throughput   store.Throughput
}

func takeSnapshot(t *testing.T, s store.Store) snapshot {
	t.Helper()
	ctx := context.Background()
	var sn snapshot
	var err error
	if sn.Counts, err = s.Counts(ctx); err != nil {
		t.Fatal(err)
	}
	if err = s.Finished(ctx, func(r store.Row) error { sn.Finished = append(sn.Finished, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if sn.LastErrors, err = s.LastErrors(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if sn.IngestErrors, err = s.IngestErrors(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if sn.Events, err = s.Events(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if sn.Heartbeat, sn.HasHeartbeat, err = s.LastHeartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if sn.Throughput, err = s.ThroughputSince(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	return sn
}

func TestReopenKeepsEverything(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t, Options{})
	var in []store.NewSample
	for i := range 40 {
		in = append(in, newSample(fmt.Sprintf("s%03d", i), []string{"short", "long"}[i%2]))
	}
	if _, err := s.Ingest(ctx, in); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Claim(ctx, "short", 12, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		r := store.Result{Response: []byte(`{"content":"x"}`), FinishReason: "stop", PromptTokens: 3, CompletionTokens: 9, Endpoint: "e", Duration: time.Second, TTFT: time.Millisecond}
		switch i % 4 {
		case 0:
			err = s.Complete(ctx, c.ID, "w", r)
		case 1:
			err = s.Reject(ctx, c.ID, "w", r, "empty", "bad")
		case 2:
			err = s.Retry(ctx, c.ID, "w", time.Now().Add(time.Hour), "503")
		case 3:
			err = s.DeadLetter(ctx, c.ID, "w", "400")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddIngestErrors(ctx, []store.IngestError{{Partition: "p", Origin: "p.jsonl:99", Field: "messages", Reason: "missing"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEvent(ctx, store.Event{Time: time.Unix(100, 5), Kind: "job_state", Subject: "job", State: "running"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutHeartbeat(ctx, store.Heartbeat{Owner: "w", PID: 1, Host: "h", Time: time.Unix(200, 0), Started: time.Unix(100, 0), Counters: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	before := takeSnapshot(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2, err := Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	after := takeSnapshot(t, s2)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("store after reopen differs (-before +after):\n%s", diff)
	}
	if len(before.Finished) != 9 || len(before.LastErrors) != 6 {
		t.Errorf("snapshot has %d finished and %d errors, want 9 and 6", len(before.Finished), len(before.LastErrors))
	}
	checkConsistent(t, s2.DB())
}

func TestClockControlsLeasesAndRetries(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	s, _ := openTemp(t, Options{Now: func() time.Time { return now }})
	if _, err := s.Ingest(ctx, []store.NewSample{newSample("a", "short"), newSample("b", "short")}); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Claim(ctx, "short", 1, "w", time.Minute)
	if err != nil || len(cs) != 1 {
		t.Fatalf("Claim = %v, %v", cs, err)
	}
	if want := now.Add(time.Minute); !cs[0].LeaseUntil.Equal(want) {
		t.Errorf("LeaseUntil = %v, want %v", cs[0].LeaseUntil, want)
	}
	if err := s.Retry(ctx, "a", "w", now.Add(10*time.Second), "503"); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance time.Duration
		want    []string
	}{
		{0, []string{"b"}},           // a waits until now+10s
		{9 * time.Second, nil},       // still waiting
		{time.Second, []string{"a"}}, // not_before <= now: due
	}
	for _, st := range steps {
		now = now.Add(st.advance)
		cs, err := s.Claim(ctx, "short", 10, "w2", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range cs {
			got = append(got, c.ID)
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("after +%v: claimed (-want +got):\n%s", st.advance, diff)
		}
	}
	// ExtendLeases counts from the store clock.
	now = now.Add(30 * time.Second)
	if err := s.ExtendLeases(ctx, "w2", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ExpireLeases(ctx, now.Add(59*time.Second)); err != nil || n != 0 {
		t.Errorf("ExpireLeases(now+59s) = %d, %v; want 0", n, err)
	}
	if n, err := s.ExpireLeases(ctx, now.Add(61*time.Second)); err != nil || n != 2 {
		t.Errorf("ExpireLeases(now+61s) = %d, %v; want 2", n, err)
	}
}

func TestIngestRefusesEmptyID(t *testing.T) {
	s, _ := openTemp(t, Options{})
	n, err := s.Ingest(context.Background(), []store.NewSample{newSample("a", "short"), newSample("", "short")})
	if err == nil || n != 0 {
		t.Fatalf("Ingest with empty id = %d, %v; want 0 and an error", n, err)
	}
	if c, _ := s.Counts(context.Background()); len(c) != 0 {
		t.Errorf("Counts after refused batch = %v, want none (the batch is one transaction)", c)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	s, path := openTemp(t, Options{})
	if _, err := s.DB().Exec(fmt.Sprintf("PRAGMA user_version = %d", schemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s2, err := Open(path); err == nil {
		s2.Close()
		t.Fatalf("Open of a newer schema succeeded, want an error")
	} else if !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open error = %v, want one naming the newer schema", err)
	}
}

func TestPragmas(t *testing.T) {
	s, _ := openTemp(t, Options{})
	for _, tc := range []struct{ pragma, want string }{
		{"journal_mode", "wal"},
		{"synchronous", "1"}, // NORMAL
		{"busy_timeout", "5000"},
		{"foreign_keys", "1"},
		{"user_version", fmt.Sprint(schemaVersion)},
	} {
		var got string
		if err := s.DB().QueryRow("PRAGMA " + tc.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", tc.pragma, err)
		}
		if got != tc.want {
			t.Errorf("PRAGMA %s = %q, want %q", tc.pragma, got, tc.want)
		}
	}
}

// TestQueryPlans pins the indexes the hot queries use, so a schema change
// cannot silently turn a 10^6-row claim into a table scan.
func TestQueryPlans(t *testing.T) {
	s, _ := openTemp(t, Options{})
	for _, tc := range []struct {
		name, query string
		args        []any
		want        string
	}{
		{"claim ready", `SELECT seq FROM samples WHERE state = 'pending' AND lane = ? AND not_before = 0 ORDER BY seq LIMIT ?`,
			[]any{"short", 10}, "USING COVERING INDEX samples_ready (lane=?)"},
		{"claim waiting", `SELECT seq FROM samples WHERE state = 'pending' AND lane = ? AND not_before > 0 AND not_before <= ? ORDER BY seq LIMIT ?`,
			[]any{"short", 0, 10}, "USING COVERING INDEX samples_waiting (lane=? AND not_before>? AND not_before<?)"},
		{"expire", `SELECT seq FROM samples WHERE state = 'leased' AND lease_until < ?`, []any{0}, "INDEX samples_leased"},
		{"owner", `SELECT seq FROM samples WHERE state = 'leased' AND lease_owner = ?`, []any{"w"}, "INDEX samples_leased (lease_owner=?)"},
		{"finished", `SELECT s.id FROM samples s LEFT JOIN results r ON r.sample_id = s.id
			WHERE s.finished_at IS NOT NULL AND s.id > ? ORDER BY s.id LIMIT ?`, []any{"", 10}, "INDEX samples_finished (id>?)"},
		{"throughput", `SELECT count(*), sum(completion_tokens), sum(prompt_tokens) FROM results WHERE finished_at >= ?`,
			[]any{0}, "USING COVERING INDEX results_finished_at (finished_at>?)"},
		{"errors", `SELECT id FROM samples WHERE last_error_at IS NOT NULL ORDER BY last_error_at DESC, seq DESC LIMIT ?`,
			[]any{10}, "INDEX samples_errors"},
		// Bad source rows may be as many as source rows: page on the primary key.
		{"ingest errors page", nextIngestErrorsSQL, []any{0, 10}, "INTEGER PRIMARY KEY (rowid>?)"},
		// A claim of a later turn reads that sample's turns only.
		{"earlier turns", priorTurnsSQL, []any{"a", 3}, "INDEX sqlite_autoindex_turns_1 (sample_id=? AND turn<?)"},
		{"earlier turns of a page", `SELECT sample_id, turn FROM turns WHERE sample_id >= ? AND sample_id <= ? ORDER BY sample_id, turn`,
			[]any{"a", "b"}, "INDEX sqlite_autoindex_turns_1 (sample_id>? AND sample_id<?)"},
		{"rejected by rule", `SELECT sample_id FROM results WHERE rule <> '' AND (? = '' OR rule = ?)`, []any{"x", "x"}, "INDEX results_rule"},
		{"token histograms", `SELECT partition, lane, kind, tokens, n FROM stat_tokens WHERE n > 0 ORDER BY partition, lane, kind, tokens`,
			nil, "SCAN stat_tokens"},
	} {
		plan := explain(t, s.DB(), tc.query, tc.args...)
		if !strings.Contains(plan, tc.want) {
			t.Errorf("%s: plan %q does not contain %q", tc.name, plan, tc.want)
		}
	}
	// The whole claim statement: both halves on their indexes, no table scan.
	plan := explain(t, s.DB(), claimSQL, sql.Named("owner", "w"), sql.Named("until", 1), sql.Named("lane", "short"),
		sql.Named("now", 1), sql.Named("n", 10))
	for _, want := range []string{"samples_ready", "samples_waiting", "INTEGER PRIMARY KEY (rowid=?)"} {
		if !strings.Contains(plan, want) {
			t.Errorf("claim statement plan %q does not contain %q", plan, want)
		}
	}
	if strings.Contains(plan, "SCAN samples") {
		t.Errorf("claim statement plan %q scans samples", plan)
	}
	t.Logf("claim plan: %s", plan)
}

func explain(t *testing.T, db *sql.DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.Query("EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, detail)
	}
	return strings.Join(lines, "; ")
}

// checkConsistent asserts the invariants that must hold in any file,
// whatever crashed while writing it.
func checkConsistent(t *testing.T, db *sql.DB) {
	t.Helper()
	var ok string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&ok); err != nil || ok != "ok" {
		t.Errorf("integrity_check = %q, %v", ok, err)
	}
	for _, c := range []struct{ name, query string }{
		{"done or rejected without exactly one result",
			`SELECT count(*) FROM samples s WHERE s.state IN ('done', 'rejected')
			 AND (SELECT count(*) FROM results r WHERE r.sample_id = s.id) <> 1`},
		{"result for a sample neither done nor rejected",
			`SELECT count(*) FROM results r LEFT JOIN samples s ON s.id = r.sample_id
			 WHERE s.state IS NULL OR s.state NOT IN ('done', 'rejected')`},
		{"finished_at set iff finished",
			`SELECT count(*) FROM samples WHERE (finished_at IS NOT NULL) <> (state IN ('done', 'rejected', 'dead'))`},
		{"lease set iff leased",
			`SELECT count(*) FROM samples WHERE (lease_owner IS NOT NULL AND lease_until IS NOT NULL) <> (state = 'leased')`},
		{"counts differ from samples",
			`SELECT count(*) FROM (
				SELECT partition, lane, state, count(*) AS n FROM samples GROUP BY 1, 2, 3
				EXCEPT SELECT partition, lane, state, n FROM counts WHERE n > 0)`},
		{"counts has cells samples lack",
			`SELECT count(*) FROM (
				SELECT partition, lane, state, n FROM counts WHERE n <> 0
				EXCEPT SELECT partition, lane, state, count(*) FROM samples GROUP BY 1, 2, 3)`},
	} {
		var n int
		if err := db.QueryRow(c.query).Scan(&n); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n != 0 {
			t.Errorf("%s: %d rows", c.name, n)
		}
	}
}

// TestMissingBodyIsDamage: a sample whose body row is gone is reported as
// a damaged store, by Claim and by the rebuild of a held-back sample,
// never handed on as an empty request or skipped silently.
func TestMissingBodyIsDamage(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Ingest(ctx, []store.NewSample{{ID: "p/1", Partition: "p", Lane: "short", Body: []byte(`{"a":1}`), Origin: "q.jsonl:1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sample_bodies`); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Claim(ctx, "short", 1, "w", time.Minute); err == nil || !strings.Contains(err.Error(), "p/1 has no body") {
		t.Errorf("Claim of a sample without its body = %+v, %v; want an error naming it", c, err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE samples SET state = 'pending', lease_owner = NULL, lease_until = NULL, not_before = -1`); err != nil {
		t.Fatal(err)
	}
	_, err = s.Ingest(ctx, []store.NewSample{{ID: "p/1", Partition: "p", Lane: "short", Body: []byte(`{"a":2}`), Origin: "q.jsonl:1"}})
	if err == nil || !strings.Contains(err.Error(), "rebuild body") {
		t.Errorf("rebuild of a sample without its body row: %v; want an error", err)
	}
}
