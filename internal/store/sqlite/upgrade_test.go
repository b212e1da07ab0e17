package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/storetest"
)

// TestUpgradeFromFirstSchema builds a file exactly as the first schema
// version left it (a sample, a result, the single heartbeat row, an event),
// opens it with this binary and checks that everything is still there and
// the new capabilities work on it.
func TestUpgradeFromFirstSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, q := range []string{
		migrations[0],
		`PRAGMA user_version = 1`,
		`INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin, state, attempts, created_at, finished_at)
			VALUES ('a', 'p', 'short', x'7b7d', 3, 'p.jsonl:1', 'done', 1, 1, 2)`,
		`INSERT INTO results (sample_id, response, finish_reason, prompt_tokens, completion_tokens, endpoint, duration_ns, ttft_ns, finished_at)
			VALUES ('a', x'7b7d', 'stop', 3, 4, 'http://e', 5, 6, 2)`,
		`INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin, state, created_at)
			VALUES ('b', 'p', 'short', x'7b7d', 3, 'p.jsonl:2', 'pending', 1)`,
		`INSERT INTO heartbeat (id, owner, pid, host, time, started, counters) VALUES (1, 'old-runner', 42, 'gpu01', ` +
			itoa(started.Add(time.Minute).UnixNano()) + `, ` + itoa(started.UnixNano()) + `, x'7b7d')`,
		`INSERT INTO events (time, kind, subject, state, evidence) VALUES (7, 'job_state', 'job', 'RUNNING', 'old')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("build old store: %v\n%s", err, q)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open of a first-version store: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	var v int
	if err := s.DB().QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("user_version after upgrade = %d, %v; want %d", v, err, schemaVersion)
	}
	hb, ok, err := s.LastHeartbeat(ctx)
	if err != nil || !ok {
		t.Fatalf("LastHeartbeat after upgrade: ok=%v err=%v", ok, err)
	}
	want := store.Heartbeat{Owner: "old-runner", PID: 42, Host: "gpu01", Time: started.Add(time.Minute), Started: started, Counters: []byte(`{}`)}
	if diff := cmp.Diff(want, hb); diff != "" {
		t.Errorf("heartbeat kept through the upgrade (-want +got):\n%s", diff)
	}
	events, err := s.Events(ctx, 0)
	if err != nil || len(events) != 1 || events[0].Evidence != "old" || events[0].Worker != "" {
		t.Errorf("events after upgrade = %+v, %v; want the old one, untagged", events, err)
	}
	var rows []store.Row
	if err := s.Finished(ctx, func(r store.Row) error { rows = append(rows, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != "a" || rows[0].Result.CompletionTokens != 4 {
		t.Errorf("finished after upgrade = %+v, want a with its result", rows)
	}
	// The new tables work on the upgraded file.
	must(t, s.PutHeartbeat(ctx, store.Heartbeat{Owner: "new", Time: started.Add(time.Hour)}))
	if hbs, err := s.Heartbeats(ctx); err != nil || len(hbs) != 2 || hbs[0].Owner != "new" {
		t.Errorf("Heartbeats after upgrade = %+v, %v; want new then old-runner", hbs, err)
	}
	must(t, s.PutSourceFile(ctx, store.SourceFile{Partition: "p", Path: "p.jsonl", Complete: true}))
	// Origins survive the move of their file part into a table of its own,
	// for old samples and new ones alike.
	if _, err := s.Ingest(ctx, []store.NewSample{{ID: "c", Partition: "p", Lane: "short", Body: []byte(`{}`), Origin: "/data/x:y.parquet:row 7"}}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"a": "p.jsonl:1", "b": "p.jsonl:2", "c": "/data/x:y.parquet:row 7"} {
		var got string
		if err := s.DB().QueryRow(`SELECT o.prefix || s.origin_pos FROM samples s JOIN origins o ON o.id = s.origin_file WHERE s.id = ?`, id).Scan(&got); err != nil || got != want {
			t.Errorf("origin of %s = %q, %v; want %q", id, got, err, want)
		}
	}
	// The sample browser reads old samples with their origins and results,
	// and the dashboard's history table exists.
	listed, err := s.Samples(ctx, store.SampleQuery{Partition: "p"})
	if err != nil || len(listed) != 3 || listed[0].ID != "a" || listed[0].Origin != "p.jsonl:1" ||
		listed[0].Result.CompletionTokens != 4 || listed[1].Origin != "p.jsonl:2" {
		t.Errorf("Samples after upgrade = %+v, %v; want a (with its result), b and c with their origins", listed, err)
	}
	if r, ok, err := s.Sample(ctx, "a"); err != nil || !ok || string(r.Result.Response) != "{}" || r.Origin != "p.jsonl:1" {
		t.Errorf("Sample(a) after upgrade = %+v, %v, %v; want its result and origin", r, ok, err)
	}
	minute := []store.Minute{{Time: started, Worker: "new", Tokens: 5, KVUsage: -1, Queued: -1, Running: -1}}
	must(t, s.PutMinutes(ctx, minute))
	if got, err := s.Minutes(ctx, started); err != nil || !cmp.Equal(got, minute) {
		t.Errorf("Minutes after upgrade = %+v, %v; want %+v", got, err, minute)
	}
	wantCounts := []store.Count{{Partition: "p", Lane: "short", State: store.Done, N: 1}, {Partition: "p", Lane: "short", State: store.Pending, N: 2}}
	if c, err := s.Counts(ctx); err != nil || !cmp.Equal(c, wantCounts) {
		t.Errorf("Counts after upgrade and a new ingest = %v, %v; want %v", c, err, wantCounts)
	}
	c := claimAll(t, s, "short")
	if len(c) != 2 || c[0].ID != "b" || c[1].ID != "c" {
		t.Errorf("claim after upgrade = %+v, want b and c", c)
	}

	// The store kept no configuration: its answers are generation 1, and
	// the first run adopts its job's configuration without refusing.
	if rows[0].Result.Generation != 1 {
		t.Errorf("generation of an answer stored before generations = %d, want 1", rows[0].Result.Generation)
	}
	cfg := store.Config{Fingerprint: "f1", Canonical: []byte(`{"model":"m"}`)}
	g, err := s.Configure(ctx, cfg, store.ConfigureOptions{})
	if err != nil || g.N != 1 || g.Fingerprint != "f1" {
		t.Fatalf("Configure on an upgraded store = %+v, %v; want generation 1 adopted", g, err)
	}
	if gs, err := s.Generations(ctx); err != nil || len(gs) != 1 || gs[0].Answers != 1 {
		t.Errorf("Generations on an upgraded store = %+v, %v; want generation 1 with its 1 answer", gs, err)
	}
}

func itoa(v int64) string { return fmt.Sprint(v) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func claimAll(t *testing.T, s *Store, lane string) []store.Claimed {
	t.Helper()
	c, err := s.Claim(context.Background(), lane, 100, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUpgradeFromSchema7 opens a file as schema 7 (the last before stores
// recorded their owner and held samples back for rebuilding) left it, with
// names stored absolute: it opens, its names can be made relative, and a
// new generation that rebuilds its partition works on it.
func TestUpgradeFromSchema7(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range append(append([]string{}, migrations[:7]...), `PRAGMA user_version = 7`,
		`INSERT INTO origins (id, prefix) VALUES (1, '/jobs/x/q.jsonl:')`,
		`INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin_file, origin_pos, state)
			VALUES ('p/1', 'p', 'short', x'7b7d', 3, 1, '1', 'pending')`,
		`INSERT INTO counts (partition, lane, state, n) VALUES ('p', 'short', 'pending', 1)`,
		`INSERT INTO source_files (partition, path, size, mod_time, fingerprint, rows, bad, complete, updated_at)
			VALUES ('p', '/jobs/x/q.jsonl', 10, 1, 'v1:f', 1, 0, 1, 1)`) {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("build schema-7 store: %v\n%s", err, q)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open of a schema-7 store: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, ok, err := s.Meta(ctx, "owner"); err != nil || ok {
		t.Errorf("owner of an upgraded store: ok=%v err=%v, want none recorded", ok, err)
	}
	if n, err := s.Relocate(ctx, "/jobs/x"); err != nil || n != 2 {
		t.Errorf("Relocate = %d, %v; want the origin and the manifest entry", n, err)
	}
	if r, ok, err := s.Sample(ctx, "p/1"); err != nil || !ok || r.Origin != "q.jsonl:1" {
		t.Errorf("Sample after Relocate = %+v, %v, %v; want origin q.jsonl:1", r, ok, err)
	}
	configure := func(fp string, o store.ConfigureOptions) {
		t.Helper()
		if _, err := s.Configure(ctx, store.Config{Fingerprint: fp, Canonical: []byte(`{}`)}, o); err != nil {
			t.Fatal(err)
		}
	}
	configure("f1", store.ConfigureOptions{})
	configure("f2", store.ConfigureOptions{NewGeneration: true, Rebuild: []string{"p"}})
	if c := claimAll(t, s, "short"); len(c) != 0 {
		t.Errorf("claimed %d samples held back for rebuilding, want none", len(c))
	}
	if _, err := s.Ingest(ctx, []store.NewSample{{ID: "p/1", Partition: "p", Lane: "short", Body: []byte(`{"new":1}`), Origin: "q.jsonl:1"}}); err != nil {
		t.Fatal(err)
	}
	if c := claimAll(t, s, "short"); len(c) != 1 || string(c[0].Body) != `{"new":1}` {
		t.Errorf("claim after the rebuild = %+v, want p/1 with its new body", c)
	}
}

// TestUpgradeFromSchema8 opens a file as schema 8 (bad rows unique by
// origin alone) left it: its bad rows keep their order and fields, and the
// same row bad for a second partition is recorded beside the first's.
func TestUpgradeFromSchema8(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range append(append([]string{}, migrations[:8]...), `PRAGMA user_version = 8`,
		`INSERT INTO ingest_errors (seq, origin, partition, field, reason, created_at) VALUES (4, 'a.jsonl:9', 'p', 'prompt', 'missing', 1)`,
		`INSERT INTO ingest_errors (seq, origin, partition, field, reason, created_at) VALUES (7, 'a.jsonl:2', 'p', 'prompt', 'cut', 1)`) {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("build schema-8 store: %v\n%s", err, q)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open of a schema-8 store: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.AddIngestErrors(ctx, []store.IngestError{{Partition: "q", Origin: "a.jsonl:9", Field: "alt", Reason: "missing"}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.IngestErrors(ctx, 0)
	want := []store.IngestError{{Partition: "p", Origin: "a.jsonl:9", Field: "prompt", Reason: "missing"},
		{Partition: "p", Origin: "a.jsonl:2", Field: "prompt", Reason: "cut"}, {Partition: "q", Origin: "a.jsonl:9", Field: "alt", Reason: "missing"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("bad rows after the upgrade = %+v, %v; want %+v", got, err, want)
	}
}

// schema11Samples are the samples TestUpgradeFromSchema11 stores, one in
// every state a job can leave one in, each with a body of its own.
var schema11Samples = []struct{ id, state, extra string }{
	{"fresh", "pending", ""},
	{"waiting", "pending", ", not_before = 5, attempts = 1, last_error = 'boom', last_error_at = 5"},
	{"leased", "leased", ", lease_owner = 'old', lease_until = 10"},
	{"done", "done", ", attempts = 1, finished_at = 7"},
	{"rejected", "rejected", ", attempts = 1, finished_at = 7"},
	{"dead", "dead", ", attempts = 3, last_error = 'gone', last_error_at = 6, finished_at = 6"},
	{"turn1", "pending", ", turn = 1"},
	{"stale", "pending", ", not_before = -1"},
	{"stale-q", "pending", ", not_before = -1, partition = 'q'"},
}

func schema11Body(id string) string { return `{"messages":[{"role":"user","content":"` + id + `"}]}` }

// buildSchema11 writes a store as schema 11 (bodies inside the sample row)
// left it, holding schema11Samples with their answers and counts.
func buildSchema11(t *testing.T, path string) {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	qs := append(append([]string{}, migrations[:11]...), `PRAGMA user_version = 11`,
		`INSERT INTO origins (id, prefix) VALUES (1, 'p.jsonl:')`)
	for i, smp := range schema11Samples {
		qs = append(qs, fmt.Sprintf(`INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin_file, origin_pos, state)
			VALUES ('%s', 'p', 'short', CAST('%s' AS BLOB), 3, 1, '%d', '%s')`, smp.id, schema11Body(smp.id), i+1, smp.state))
		if smp.extra != "" {
			qs = append(qs, fmt.Sprintf(`UPDATE samples SET %s WHERE id = '%s'`, smp.extra[2:], smp.id))
		}
	}
	qs = append(qs,
		// The update trigger counted the partition moves above; count afresh.
		`DELETE FROM counts`,
		`INSERT INTO counts (partition, lane, state, n) SELECT partition, lane, state, count(*) FROM samples GROUP BY 1, 2, 3`,
		`INSERT INTO results (sample_id, response, finish_reason, prompt_tokens, completion_tokens, endpoint, duration_ns, ttft_ns,
			reason, finished_at, turn, partition, lane, reasoning_tokens, rule, end_reason, generation) VALUES
			('done', '{"a":1}', 'stop', 3, 4, 'e', 1, 1, '', 7, 0, 'p', 'short', 0, '', '', 1),
			('rejected', '{"a":2}', 'stop', 3, 4, 'e', 1, 1, 'too short', 7, 0, 'p', 'short', 0, 'min', '', 1)`,
		`INSERT INTO turns (sample_id, turn, partition, lane, response, finish_reason, prompt_tokens, completion_tokens,
			reasoning_tokens, endpoint, duration_ns, ttft_ns, attempts, finished_at, generation)
			VALUES ('turn1', 0, 'p', 'short', '{"t":0}', 'stop', 3, 4, 0, 'e', 1, 1, 1, 7, 1)`)
	for _, q := range qs {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("build schema-11 store: %v\n%s", err, q)
		}
	}
}

// TestUpgradeFromSchema11 opens a file as schema 11 (bodies inside the
// sample row) left it, with a sample in every state: every body, state,
// count and answer survives the move of bodies to their own table, and the
// job then finishes on it (an expired lease, a retry, a next turn, a
// rebuilt body, a requeued dead letter, a duplicate id, a dropped stale
// sample whose body goes with it).
func TestUpgradeFromSchema11(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	buildSchema11(t, path)
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open of a schema-11 store: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, smp := range schema11Samples {
		r, ok, err := s.Sample(ctx, smp.id)
		if err != nil || !ok || string(r.Body) != schema11Body(smp.id) || string(r.State) != smp.state {
			t.Errorf("sample %s after upgrade = %+v, %v, %v; want state %s and its body", smp.id, r, ok, err, smp.state)
		}
	}
	counts, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantCounts := map[string]int{"pending": 4, "leased": 1, "done": 1, "rejected": 1, "dead": 1}
	for _, c := range counts {
		if c.Partition == "p" && c.N != wantCounts[string(c.State)] {
			t.Errorf("count %s after upgrade = %d, want %d", c.State, c.N, wantCounts[string(c.State)])
		}
	}
	finishSchema11Job(t, s)
	var orphans, bodies int
	must(t, s.DB().QueryRow(`SELECT count(*) FROM sample_bodies WHERE seq NOT IN (SELECT seq FROM samples)`).Scan(&orphans))
	must(t, s.DB().QueryRow(`SELECT count(*) FROM sample_bodies`).Scan(&bodies))
	if orphans != 0 || bodies != len(schema11Samples)-1 {
		t.Errorf("sample_bodies holds %d bodies, %d without a sample; want %d, none", bodies, orphans, len(schema11Samples)-1)
	}
}

// finishSchema11Job runs the upgraded job to its end and checks every
// claim carried the stored body and every finished row reads it back.
func finishSchema11Job(t *testing.T, s *Store) {
	ctx := context.Background()
	if n, err := s.ExpireLeases(ctx, time.Now()); err != nil || n != 1 {
		t.Fatalf("ExpireLeases = %d, %v; want the old lease", n, err)
	}
	if n, err := s.RequeueDead(ctx, ""); err != nil || n != 1 {
		t.Fatalf("RequeueDead = %d, %v", n, err)
	}
	if n, err := s.DropStale(ctx, "q"); err != nil || n != 1 {
		t.Fatalf("DropStale = %d, %v", n, err)
	}
	rebuilt := `{"messages":[{"role":"user","content":"rebuilt"}]}`
	if n, err := s.Ingest(ctx, []store.NewSample{
		{ID: "stale", Partition: "p", Lane: "short", Body: []byte(rebuilt), PromptTokens: 3, Origin: "p.jsonl:8"},
		{ID: "done", Partition: "p", Lane: "short", Body: []byte(schema11Body("done")), Origin: "other.jsonl:1"},
	}); err != nil || n != 0 {
		t.Fatalf("Ingest after upgrade = %d, %v; want nothing new", n, err)
	}
	if d, err := s.IngestDuplicates(ctx, 10); err != nil || d.Total != 1 || d.SameContent != 1 || d.Examples[0].FirstOrigin != "p.jsonl:4" {
		t.Errorf("duplicates after upgrade = %+v, %v; want done, same content as p.jsonl:4", d, err)
	}
	claimed := claimAll(t, s, "short")
	if len(claimed) != 6 {
		t.Fatalf("claimed %d samples after upgrade, want 6: %+v", len(claimed), claimed)
	}
	for _, c := range claimed {
		want := schema11Body(c.ID)
		if c.ID == "stale" {
			want = rebuilt
		}
		if string(c.Body) != want {
			t.Errorf("claim of %s carried body %s, want %s", c.ID, c.Body, want)
		}
		if c.ID == "turn1" && (c.Turn != 1 || len(c.Prior) != 1 || string(c.Prior[0].Response) != `{"t":0}`) {
			t.Errorf("claim of turn1 = turn %d, prior %+v; want turn 1 after the stored answer", c.Turn, c.Prior)
		}
		must(t, s.Complete(ctx, c.ID, "w", store.Result{Turn: c.Turn, Response: []byte(`{}`), FinishReason: "stop", PromptTokens: 1, CompletionTokens: 2}))
	}
	var finished []string
	must(t, s.Finished(ctx, func(r store.Row) error {
		want := schema11Body(r.ID)
		if r.ID == "stale" {
			want = rebuilt
		}
		if string(r.Body) != want {
			t.Errorf("finished %s has body %s, want %s", r.ID, r.Body, want)
		}
		finished = append(finished, r.ID+"="+string(r.State))
		return nil
	}))
	want := []string{"dead=done", "done=done", "fresh=done", "leased=done", "rejected=rejected", "stale=done", "turn1=done", "waiting=done"}
	if !slices.Equal(finished, want) {
		t.Errorf("finished after upgrade = %v, want %v", finished, want)
	}
}

// TestUpgradeAddsCaptureServerPath opens a file as the schema before
// captures.server_path left it, with a capture in every state: each keeps
// its state, hands on no server path, and server paths work after.
func TestUpgradeAddsCaptureServerPath(t *testing.T) {
	before := schemaVersion - 1 // the step before captureServerPathStep
	if migrations[before] != captureServerPathStep {
		t.Fatalf("migrations[%d] is not captureServerPathStep: update this test when renumbering", before)
	}
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	qs := append(append([]string{}, migrations[:before]...), fmt.Sprintf(`PRAGMA user_version = %d`, before))
	for _, q := range append(qs, storetest.CaptureRowsBeforeServerPath...) {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("build schema-%d store: %v\n%s", before, err, q)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open of a schema-%d store: %v", before, err)
	}
	defer s.Close()
	storetest.CheckCapturesAfterServerPath(t, s)
}

// TestUpgradeBodiesMoveNeedsRoom: a schema-11 store whose folder has less
// than twice its bodies' volume free is refused before any change, with
// the numbers, and opens at schema 11 still once there is room (saying
// in one line that the move runs).
func TestUpgradeBodiesMoveNeedsRoom(t *testing.T) {
	defer func(f func(string) (int64, error), w io.Writer) { freeSpace, upgradeNotes = f, w }(freeSpace, upgradeNotes)
	var notes bytes.Buffer
	upgradeNotes = &notes
	path := filepath.Join(t.TempDir(), "old.db")
	buildSchema11(t, path)
	var bodies int64
	for _, smp := range schema11Samples {
		bodies += int64(len(schema11Body(smp.id)))
	}
	freeSpace = func(string) (int64, error) { return 2*bodies - 1, nil }
	_, err := Open(path)
	want := fmt.Sprintf("upgrading old.db to schema 12 moves %d bytes of sample bodies and needs about %d bytes free; its folder has %d bytes",
		bodies, 2*bodies, 2*bodies-1)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open on a nearly full disk = %v; want %q", err, want)
	}
	if notes.Len() != 0 {
		t.Errorf("said %q for a refused upgrade", notes.String())
	}
	db, err := sql.Open("sqlite", path)
	must(t, err)
	var v int
	must(t, db.QueryRow("PRAGMA user_version").Scan(&v))
	db.Close()
	if v != 11 {
		t.Errorf("schema after the refusal = %d, want 11 untouched", v)
	}
	freeSpace = func(string) (int64, error) { return 5e9, nil }
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open with room: %v", err)
	}
	defer s.Close()
	if r, ok, err := s.Sample(context.Background(), "fresh"); err != nil || !ok || string(r.Body) != schema11Body("fresh") {
		t.Errorf("sample after the refused then allowed upgrade = %+v, %v, %v", r, ok, err)
	}
	wantNote := fmt.Sprintf("regen: upgrading old.db to schema 12: moving %d bytes of sample bodies to their own table (its folder has 5.0 GB free)\n", bodies)
	if notes.String() != wantNote {
		t.Errorf("said %q, want %q", notes.String(), wantNote)
	}
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int64]string{0: "0 bytes", 999: "999 bytes", 3_100_000_000: "3.1 GB", 6_200_000_000: "6.2 GB", 1_500_000: "1.5 MB"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}
