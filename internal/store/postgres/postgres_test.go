package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
	"github.com/regen-dev/regen/internal/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	dbOnce  sync.Once
	dbDSN   string
	schemas atomic.Int64
)

// testDB is one database shared by the package's tests; each store gets a
// schema of its own, which is what isolates two jobs in production too.
func testDB(t testing.TB) string {
	t.Helper()
	srv := pgtest.Get(t)
	dbOnce.Do(func() { dbDSN = srv.Database(t) })
	return dbDSN
}

func newSchema() string { return fmt.Sprintf("regen_test_%d", schemas.Add(1)) }

func openTest(t testing.TB, o Options) *Store {
	t.Helper()
	if o.Schema == "" {
		o.Schema = newSchema()
	}
	s, err := Open(context.Background(), testDB(t), o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTest(t, Options{}) })
}

func TestUpgradeFromFirstSchema(t *testing.T) {
	ctx := context.Background()
	schema := newSchema()
	old := openTest(t, Options{Schema: schema, targetVersion: 1})
	storetestIngest(t, old, "a", "b")
	if _, err := old.Pool().Exec(ctx, `SELECT 1 FROM source_files`); err == nil {
		t.Fatal("a version-1 schema already has the manifest table")
	}
	old.Close()

	s := openTest(t, Options{Schema: schema})
	defer s.Close()
	var v int
	if err := s.Pool().QueryRow(ctx, `SELECT version FROM regen_schema`).Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("version after upgrade = %d, %v; want %d", v, err, schemaVersion)
	}
	if err := s.PutSourceFile(ctx, store.SourceFile{Partition: "p", Path: "/x", Complete: true}); err != nil {
		t.Fatalf("manifest after upgrade: %v", err)
	}
	// The sample browser lists the old samples with their origins, and the
	// dashboard's history table exists.
	rows, err := s.Samples(ctx, store.SampleQuery{Partition: "p"})
	if err != nil || len(rows) != 2 || rows[0].ID != "a" || rows[0].Origin != "p.jsonl:a" || rows[1].Origin != "p.jsonl:b" {
		t.Fatalf("Samples after upgrade = %+v, %v; want a and b with their origins", rows, err)
	}
	minute := []store.Minute{{Time: time.Unix(600, 0), Worker: "w", Tokens: 5, KVUsage: -1, Queued: -1, Running: -1}}
	if err := s.PutMinutes(ctx, minute); err != nil {
		t.Fatalf("PutMinutes after upgrade: %v", err)
	}
	if got, err := s.Minutes(ctx, time.Unix(600, 0)); err != nil || !cmp.Equal(got, minute) {
		t.Fatalf("Minutes after upgrade = %+v, %v; want %+v", got, err, minute)
	}
	c, err := s.Claim(ctx, "short", 10, "w", time.Minute)
	if err != nil || len(c) != 2 {
		t.Fatalf("claim after upgrade = %v, %v; want the 2 samples ingested before it", c, err)
	}
	// A store from before configurations adopts the first run's.
	g, err := s.Configure(ctx, store.Config{Fingerprint: "f1", Canonical: []byte(`{}`)}, store.ConfigureOptions{})
	if err != nil || g.N != 1 {
		t.Fatalf("Configure after upgrade = %+v, %v; want generation 1", g, err)
	}
}

// Workers started at once with different job files on one shared store:
// the first to configure sets the configuration, every other one is
// refused with it, whatever the timing.
func TestWorkersWithDifferentJobFiles(t *testing.T) {
	ctx := context.Background()
	for round := range 4 {
		schema := newSchema()
		cfgs := []store.Config{
			{Fingerprint: "temp-0.7", Canonical: []byte(`{"generation":{"temperature":0.7}}`)},
			{Fingerprint: "temp-1.3", Canonical: []byte(`{"generation":{"temperature":1.3}}`)},
			{Fingerprint: "temp-0.7", Canonical: []byte(`{"generation":{"temperature":0.7}}`)},
			{Fingerprint: "temp-1.3", Canonical: []byte(`{"generation":{"temperature":1.3}}`)},
		}
		workers := make([]*Store, len(cfgs))
		for i := range workers {
			workers[i] = openTest(t, Options{Schema: schema})
			defer workers[i].Close()
		}
		errs := make([]error, len(cfgs))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, w := range workers {
			wg.Go(func() {
				<-start
				_, errs[i] = w.Configure(ctx, cfgs[i], store.ConfigureOptions{})
			})
		}
		close(start)
		wg.Wait()
		gens, err := workers[0].Generations(ctx)
		if err != nil || len(gens) != 1 {
			t.Fatalf("round %d: Generations = %+v, %v; want exactly one", round, gens, err)
		}
		for i, err := range errs {
			var changed *store.ConfigChangedError
			switch {
			case cfgs[i].Fingerprint == gens[0].Fingerprint && err != nil:
				t.Errorf("round %d: worker %d with the stored configuration: %v", round, i, err)
			case cfgs[i].Fingerprint != gens[0].Fingerprint && !errors.As(err, &changed):
				t.Errorf("round %d: worker %d with another configuration: err = %v, want ConfigChangedError", round, i, err)
			case changed != nil && changed.Current.Fingerprint != gens[0].Fingerprint:
				t.Errorf("round %d: worker %d refused against %s, stored is %s", round, i, changed.Current.Fingerprint, gens[0].Fingerprint)
			}
		}
	}
}

func storetestIngest(t *testing.T, s store.Store, ids ...string) {
	t.Helper()
	var in []store.NewSample
	for _, id := range ids {
		in = append(in, store.NewSample{ID: id, Partition: "p", Lane: "short", Body: []byte(`{}`), Origin: "p.jsonl:" + id})
	}
	if _, err := s.Ingest(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	schema := newSchema()
	s := openTest(t, Options{Schema: schema})
	if _, err := s.Pool().Exec(ctx, `UPDATE regen_schema SET version = $1`, schemaVersion+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err := Open(ctx, testDB(t), Options{Schema: schema})
	if !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), "upgrade regen") {
		t.Fatalf("Open of a newer schema: %v, want ErrNewerSchema telling to upgrade regen", err)
	}
}

func TestOpenNoCreate(t *testing.T) {
	ctx := context.Background()
	schema := newSchema()
	if _, err := Open(ctx, testDB(t), Options{Schema: schema, NoCreate: true}); !errors.Is(err, store.ErrNoStore) {
		t.Fatalf("Open(NoCreate) of a missing schema: %v, want ErrNoStore", err)
	}
	var n int
	conn := openTest(t, Options{}).Pool()
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("Open(NoCreate) left schema %s behind (%d, %v)", schema, n, err)
	}
	openTest(t, Options{Schema: schema}).Close()
	s, err := Open(ctx, testDB(t), Options{Schema: schema, NoCreate: true})
	if err != nil {
		t.Fatalf("Open(NoCreate) of an existing schema: %v", err)
	}
	s.Close()
}

// TestJobsIsolatedBySchema runs two jobs in one database.
func TestJobsIsolatedBySchema(t *testing.T) {
	ctx := context.Background()
	a, b := openTest(t, Options{}), openTest(t, Options{})
	defer a.Close()
	defer b.Close()
	storetestIngest(t, a, "x", "y")
	storetestIngest(t, b, "x")
	if err := a.PutHeartbeat(ctx, store.Heartbeat{Owner: "wa", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	ca, _ := a.Counts(ctx)
	cb, _ := b.Counts(ctx)
	if len(ca) != 1 || ca[0].N != 2 || len(cb) != 1 || cb[0].N != 1 {
		t.Errorf("counts a=%v b=%v, want 2 and 1", ca, cb)
	}
	if hbs, _ := b.Heartbeats(ctx); len(hbs) != 0 {
		t.Errorf("job b sees job a's heartbeats: %v", hbs)
	}
	// The same lock name in two jobs is two locks.
	ua, ok, err := a.TryLock(ctx, "export")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	defer ua()
	ub, ok, err := b.TryLock(ctx, "export")
	if err != nil || !ok {
		t.Fatalf("job b's export lock blocked by job a's: %v %v", ok, err)
	}
	ub()
}

// TestLockAcrossWorkersAndHolderDeath: two stores on one job are two
// workers; a lock held by one blocks the other until the holder's
// connection dies.
func TestLockAcrossWorkersAndHolderDeath(t *testing.T) {
	ctx := context.Background()
	schema := newSchema()
	w1, w2 := openTest(t, Options{Schema: schema}), openTest(t, Options{Schema: schema})
	defer w1.Close()
	defer w2.Close()
	unlock, ok, err := w1.TryLock(ctx, "export")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	defer unlock()
	if _, ok, err := w2.TryLock(ctx, "export"); err != nil || ok {
		t.Fatalf("second worker took a held lock: ok=%v err=%v", ok, err)
	}
	// The holder dies: its session ends without an unlock.
	var killed int
	err = w2.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()`).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminate the lock holder's session: %d, %v", killed, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u2, ok, err := w2.TryLock(ctx, "export")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			u2()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lock of a dead holder not released after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://regen:s3cret@db:5432/jobs?sslmode=disable", "postgres://regen:xxxxx@db:5432/jobs?sslmode=disable"},
		{"postgres://regen@db/jobs", "postgres://regen@db/jobs"},
		{"postgresql://db/jobs?password=s3cret&user=u", "postgresql://db/jobs?password=xxxxx&user=u"},
		{"host=db user=u password=s3cret dbname=j", "host=db user=u password=xxxxx dbname=j"},
		{"host=db password='s3 cret' dbname=j", "host=db password=xxxxx dbname=j"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestPasswordFromEnvAndPassfile connects as a role that needs its
// password (scram over TCP): from PGPASSWORD, from a PGPASSFILE, and with a
// wrong one in the DSN, whose error must not show it.
func TestPasswordFromEnvAndPassfile(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Get(t)
	dsn := testDB(t)
	db := dsn[strings.LastIndex(dsn, "/")+1 : strings.Index(dsn, "?")]
	const pw = "Pw-for-regen-7f3a"
	role := fmt.Sprintf("regen_pw_%d", schemas.Add(1))
	if err := srv.Exec(ctx, db, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'; GRANT CREATE ON DATABASE %s TO %s`, role, pw, db, role)); err != nil {
		t.Fatal(err)
	}
	noPW := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", role, srv.Port, db)

	t.Setenv("PGPASSWORD", pw)
	s, err := Open(ctx, noPW, Options{Schema: newSchema()})
	if err != nil {
		t.Fatalf("Open with PGPASSWORD: %v", err)
	}
	s.Close()

	t.Setenv("PGPASSWORD", "")
	passfile := filepath.Join(t.TempDir(), "pgpass")
	line := fmt.Sprintf("127.0.0.1:%d:%s:%s:%s\n", srv.Port, db, role, pw)
	if err := os.WriteFile(passfile, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGPASSFILE", passfile)
	s, err = Open(ctx, noPW, Options{Schema: newSchema()})
	if err != nil {
		t.Fatalf("Open with PGPASSFILE: %v", err)
	}
	if strings.Contains(s.Info().Location, pw) {
		t.Errorf("Info().Location shows the password: %s", s.Info().Location)
	}
	s.Close()

	t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
	const wrong = "Wrong-pw-91c2"
	withPW := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", role, wrong, srv.Port, db)
	_, err = Open(ctx, withPW, Options{Schema: newSchema()})
	if err == nil {
		t.Fatal("Open with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), wrong) {
		t.Errorf("error shows the password: %v", err)
	}
	if !strings.Contains(err.Error(), "xxxxx") && !strings.Contains(err.Error(), "password authentication failed") {
		t.Errorf("error does not say what failed: %v", err)
	}
}

// TestOriginsStoredOncePerFile: a sample's origin keeps its file part in a
// table of its own, one row per file even when two workers ingest the same
// files at once, and the full origin can be put back together.
func TestOriginsStoredOncePerFile(t *testing.T) {
	ctx := context.Background()
	schema := newSchema()
	w1, w2 := openTest(t, Options{Schema: schema}), openTest(t, Options{Schema: schema})
	defer w1.Close()
	defer w2.Close()
	want := map[string]string{}
	var wg sync.WaitGroup
	for w, st := range []*Store{w1, w2} {
		var in []store.NewSample
		for i := range 50 {
			id := fmt.Sprintf("s%d-%d", w, i)
			origin := fmt.Sprintf("/data/part:%d/a.jsonl:%d", i%2, i+1)
			if i%5 == 0 {
				origin = fmt.Sprintf("/data/b.parquet:row %d", i)
			}
			want[id] = origin
			in = append(in, store.NewSample{ID: id, Partition: "p", Lane: "short", Body: []byte(`{}`), Origin: origin})
		}
		wg.Go(func() {
			if _, err := st.Ingest(ctx, in); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var files int
	if err := w1.Pool().QueryRow(ctx, `SELECT count(*) FROM origins`).Scan(&files); err != nil || files != 3 {
		t.Errorf("origins rows = %d, %v; want 3 (two JSONL files and a Parquet file)", files, err)
	}
	rows, err := w1.Pool().Query(ctx, `SELECT s.id, o.prefix || s.origin_pos FROM samples s JOIN origins o ON o.id = s.origin_file`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, origin string
		if err := rows.Scan(&id, &origin); err != nil {
			t.Fatal(err)
		}
		got[id] = origin
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("origins put back together (-want +got):\n%s", diff)
	}
}

// TestBadRequestFailsAlone: a transition the database refuses (here a
// check constraint added for the test) fails on its own, the others of its
// group commit succeed, and the store goes on working.
func TestBadRequestFailsAlone(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Options{})
	defer s.Close()
	if _, err := s.Pool().Exec(ctx, `ALTER TABLE results ADD CONSTRAINT short_reason CHECK (length(reason) < 20)`); err != nil {
		t.Fatal(err)
	}
	storetestIngest(t, s, "a", "b", "c", "d")
	if _, err := s.Claim(ctx, "short", 4, "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i, id := range []string{"a", "b", "c", "d"} {
		reason := "short"
		if id == "c" {
			reason = strings.Repeat("far too long ", 5)
		}
		wg.Go(func() { errs[i] = s.Reject(ctx, id, "w", store.Result{FinishReason: "stop"}, "rule", reason) })
	}
	wg.Wait()
	for i, err := range errs {
		if (i == 2) != (err != nil) || errors.Is(err, store.ErrNotLeased) {
			t.Errorf("Reject %d: %v (only c must fail, and not as a lost lease)", i, err)
		}
	}
	// The refused one still holds its lease and can be finished otherwise.
	if err := s.Complete(ctx, "c", "w", store.Result{FinishReason: "stop"}); err != nil {
		t.Fatalf("Complete after the refused Reject: %v", err)
	}
	c, err := s.Counts(ctx)
	if err != nil || len(c) != 2 || c[0].State != store.Done || c[0].N != 1 || c[1].State != store.Rejected || c[1].N != 3 {
		t.Errorf("Counts = %v, %v; want 1 done, 3 rejected", c, err)
	}
}

// TestCountsMatchARecount drives every transition, concurrently, and then
// checks the counts each statement kept against a count of the samples.
func TestCountsMatchARecount(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Options{})
	defer s.Close()
	var in []store.NewSample
	for i := range 600 {
		in = append(in, store.NewSample{ID: fmt.Sprintf("s%04d", i), Partition: []string{"p", "q"}[i%2], Lane: "short", Body: []byte(`{}`), Origin: "x:1"})
	}
	if _, err := s.Ingest(ctx, in); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		owner := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for round := 0; ; round++ {
				cs, err := s.Claim(ctx, "short", 20, owner, time.Hour)
				if err != nil {
					t.Error(err)
					return
				}
				if len(cs) == 0 {
					return
				}
				var release []string
				for i, c := range cs {
					var err error
					switch (i + round + w) % 6 {
					case 0:
						err = s.Complete(ctx, c.ID, owner, store.Result{FinishReason: "stop"})
					case 1:
						err = s.Reject(ctx, c.ID, owner, store.Result{FinishReason: "stop"}, "rule", "bad")
					case 2:
						err = s.DeadLetter(ctx, c.ID, owner, "400")
					case 3:
						err = s.Escalate(ctx, c.ID, owner, "long")
					case 4:
						err = s.Retry(ctx, c.ID, owner, time.Now().Add(time.Hour), "503")
					case 5:
						release = append(release, c.ID)
					}
					if err != nil {
						t.Error(err)
					}
				}
				if len(release) > 0 {
					if err := s.Release(ctx, release[:len(release)/2], owner); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	// Whatever is still leased expires; some dead come back.
	if _, err := s.ExpireLeases(ctx, time.Now().Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequeueDead(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "long", 50, "w9", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReleaseOwnerExcept(ctx, "w9", nil); err != nil {
		t.Fatal(err)
	}
	got, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := s.Pool().Query(ctx, `SELECT partition, lane, state, count(*) FROM samples GROUP BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for rows.Next() {
		var p, l string
		var st int16
		var n int64
		if err := rows.Scan(&p, &l, &st, &n); err != nil {
			t.Fatal(err)
		}
		want[p+"/"+l+"/"+string(stateName(st))] = int(n)
	}
	have := map[string]int{}
	for _, c := range got {
		have[c.Partition+"/"+c.Lane+"/"+string(c.State)] = c.N
	}
	if diff := cmp.Diff(want, have); diff != "" {
		t.Errorf("Counts against a recount (-recount +Counts):\n%s", diff)
	}
	if len(want) < 6 {
		t.Errorf("only %d cells: the workload did not reach every state and lane: %v", len(want), want)
	}
}

// TestFencingToken: a worker that lost a lease and claimed the sample
// again holds a new token; a transition carrying the old token (an answer
// from the request of the lost lease) is refused for every kind of
// transition, and the one carrying the new token takes.
func TestFencingToken(t *testing.T) {
	ctx := context.Background()
	res := store.Result{FinishReason: "stop", Response: []byte(`{"x":1}`)}
	tests := []struct {
		name string
		tr   store.Transition
	}{
		{"complete", store.Transition{Op: store.OpFinish, State: store.Done, Result: res}},
		{"reject", store.Transition{Op: store.OpFinish, State: store.Rejected, Result: res, Rule: "r", Evidence: "bad"}},
		{"turn", store.Transition{Op: store.OpTurn, Result: res}},
		{"retry", store.Transition{Op: store.OpRetry, NotBefore: time.Now(), LastError: "boom"}},
		{"dead", store.Transition{Op: store.OpDead, Reason: "bad request"}},
		{"escalate", store.Transition{Op: store.OpEscalate, Lane: "long"}},
		{"relane", store.Transition{Op: store.OpRelane, Lane: "long"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openTest(t, Options{})
			defer s.Close()
			storetestIngest(t, s, tt.name)
			claim := func() store.Claimed {
				t.Helper()
				cs, err := s.Claim(ctx, "short", 1, "w", time.Minute)
				if err != nil || len(cs) != 1 || cs[0].ID != tt.name {
					t.Fatalf("Claim = %v, %v; want %s", cs, err, tt.name)
				}
				return cs[0]
			}
			first := claim()
			// Another worker found w dead and returned its leases; w, awake
			// again, claims the same sample.
			if n, err := s.ReleaseOwner(ctx, "w"); err != nil || n != 1 {
				t.Fatalf("ReleaseOwner = %d, %v; want 1", n, err)
			}
			second := claim()
			if first.Token == 0 || second.Token == first.Token {
				t.Fatalf("tokens %d then %d: want distinct, non-zero", first.Token, second.Token)
			}
			tr := tt.tr
			tr.ID, tr.Owner, tr.Token = tt.name, "w", first.Token
			if err := s.Commit(ctx, tr); !errors.Is(err, store.ErrNotLeased) {
				t.Fatalf("Commit with the lost lease's token: %v, want ErrNotLeased", err)
			}
			tr.Token = second.Token
			if err := s.Commit(ctx, tr); err != nil {
				t.Fatalf("Commit with the held lease's token: %v", err)
			}
			var results int
			if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM results WHERE sample_id = $1`, tt.name).Scan(&results); err != nil {
				t.Fatal(err)
			}
			if want := map[store.Op]int{store.OpFinish: 1}[tt.tr.Op]; results != want {
				t.Errorf("%d results stored, want %d", results, want)
			}
		})
	}
}

// TestOpenTogether: workers starting at once on a schema none of them has
// created yet all open it (one creates it, the others wait for it and find
// it current), as three `regen run` started together do.
func TestOpenTogether(t *testing.T) {
	dsn, schema := testDB(t), newSchema()
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s, err := Open(context.Background(), dsn, Options{Schema: schema})
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
		}
	}
}

// TestUpgradeAddsCaptureServerPath upgrades a schema as it was before
// captures.server_path, with a capture in every state: each keeps its
// state, hands on no server path, and server paths work after.
func TestUpgradeAddsCaptureServerPath(t *testing.T) {
	before := schemaVersion - 1 // the step before captureServerPathStep
	if migrations[before] != captureServerPathStep {
		t.Fatalf("migrations[%d] is not captureServerPathStep: update this test when renumbering", before)
	}
	ctx := context.Background()
	schema := newSchema()
	old := openTest(t, Options{Schema: schema, targetVersion: before})
	for _, q := range storetest.CaptureRowsBeforeServerPath {
		if _, err := old.Pool().Exec(ctx, q); err != nil {
			t.Fatalf("build schema-%d captures: %v\n%s", before, err, q)
		}
	}
	old.Close()

	s := openTest(t, Options{Schema: schema})
	defer s.Close()
	storetest.CheckCapturesAfterServerPath(t, s)
}
