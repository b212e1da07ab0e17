package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// sharedJob is a job several workers run together on one PostgreSQL store;
// each worker launches its own simulator (its "local server").
const sharedJob = `name: %s
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: %d, output_mean: 120, truncate_fraction: 0.1, seed: 7}
sources:
  - {partition: A, path: a.jsonl, prompt: question, id: id}
  - {partition: B, path: b.jsonl.gz, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 24, max_tokens: 256}
  - {name: long, concurrency: 12, max_tokens: 1024, partitions: [B]}
output:
  formats: [sharegpt, openai-batch]
  metadata: full
monitor: {heartbeat_every: 250ms, dead_after: 3s}
# A truncated answer in the last lane counts as done here (the tests are
# about workers and outages, not answer quality).
quality: {truncated: false}
`

// pgJob writes a shared job of perPartition samples per partition into a
// fresh directory and returns it, the ids regen must produce, and the
// environment that points regen at a fresh database (REGEN_STORE).
func pgJob(t *testing.T, name string, perPartition, speed int) (dir string, want []string, env []string, dsn string) {
	t.Helper()
	return pgJobOn(t, pgtest.Get(t), name, perPartition, speed)
}

// ownPostgres starts a PostgreSQL server for t alone, stopped when t ends:
// a test that crashes its database runs beside the tests on the shared one.
func ownPostgres(t *testing.T) *pgtest.Server {
	t.Helper()
	srv, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		pgtest.Unavailable(t, err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// pgJobOn is pgJob with its database on srv.
func pgJobOn(t *testing.T, srv *pgtest.Server, name string, perPartition, speed int) (dir string, want []string, env []string, dsn string) {
	t.Helper()
	dsn = srv.Database(t)
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(sharedJob, name, speed)), 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(perPartition), 0x7067))
	want = writeChaosSource(t, filepath.Join(dir, "a.jsonl"), "A", perPartition, rng)
	want = append(want, writeChaosSource(t, filepath.Join(dir, "b.jsonl.gz"), "B", perPartition, rng)...)
	return dir, want, []string{"REGEN_STORE=" + dsn}, dsn
}

// pgStatus runs `regen status --json` against the PostgreSQL store.
func pgStatus(t *testing.T, dir string, env []string) (monitor.Report, result) {
	t.Helper()
	res := regenEnv(t, dir, env, "status", "--json", "job.yaml")
	var r monitor.Report
	if err := json.Unmarshal([]byte(res.stdout), &r); err != nil {
		t.Fatalf("status --json output does not parse: %v\n%s", err, res)
	}
	return r, res
}

// pgRows reads every sample's state and attempts, and the number of results,
// straight from the job's schema.
func pgRows(t *testing.T, dsn, job string) (rows []storeRow, results int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	schema := pgx.Identifier{postgres.SchemaFor(job)}.Sanitize()
	q, err := conn.Query(ctx, `SELECT id, state, lane, attempts FROM `+schema+`.samples ORDER BY id`)
	if err != nil {
		t.Fatalf("read store: %v", err)
	}
	names := map[int16]string{0: "pending", 1: "leased", 2: "done", 3: "rejected", 4: "dead"}
	for q.Next() {
		var r storeRow
		var st int16
		var att int32
		if err := q.Scan(&r.ID, &st, &r.Lane, &att); err != nil {
			t.Fatal(err)
		}
		r.State, r.Attempts = names[st], int(att)
		rows = append(rows, r)
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.results`).Scan(&results); err != nil {
		t.Fatal(err)
	}
	return rows, results
}

// checkAllOnce checks the job's PostgreSQL store: every sample done exactly
// once, with one attempt (kills, restarts and outages spend none).
func checkAllOnce(t *testing.T, dsn, job string, total int) {
	t.Helper()
	rows, results := pgRows(t, dsn, job)
	checkRowsOnce(t, rows, results, total)
}

// TestE2EPostgresWorkers runs one job with three `regen run` workers on one
// PostgreSQL store, each with its own simulator: all of them work, every
// sample comes out once, exactly one worker exports while the others wait
// for it, and `regen status` shows every worker and the job DONE.
func TestE2EPostgresWorkers(t *testing.T) {
	t.Parallel()
	dir, want, env, dsn := pgJob(t, "shared", 300, 25)
	var ps []*proc
	for range 3 {
		ps = append(ps, startRegenEnv(t, dir, env, "run", "job.yaml"))
	}
	exporters := 0
	for i, p := range ps {
		res := p.wait(t)
		if res.code != 0 {
			t.Fatalf("worker %d:\n%s", i, res)
		}
		t.Logf("worker %d stdout:\n%s", i, res.stdout)
		if !strings.Contains(res.stdout, "store postgres://postgres@127.0.0.1:") {
			t.Errorf("worker %d does not say which store it uses:\n%s", i, res.stdout)
		}
		switch {
		case strings.Contains(res.stdout, "output: sharegpt"):
			exporters++
		case !strings.Contains(res.stdout, "export: already written by another worker"):
			t.Errorf("worker %d neither exported nor found the export written:\n%s", i, res.stdout)
		}
	}
	if exporters != 1 {
		t.Errorf("%d workers exported, want exactly 1", exporters)
	}
	checkExport(t, filepath.Join(dir, "out"), "shared", want, false)
	checkAllOnce(t, dsn, "shared", len(want))

	rep, res := pgStatus(t, dir, env)
	if rep.State != monitor.Done || res.code != 0 {
		t.Errorf("status: %s exit %d, want DONE exit 0\n%s", rep.State, res.code, res)
	}
	if len(rep.Workers) != 3 {
		t.Fatalf("status lists %d workers, want 3:\n%s", len(rep.Workers), res.stdout)
	}
	var done int64
	for _, w := range rep.Workers {
		done += w.Done
		if w.Done == 0 {
			t.Errorf("worker pid %d finished no sample; the job was not shared", w.PID)
		}
		if w.State != monitor.Done {
			t.Errorf("worker pid %d: %s, want DONE (exited after the export)", w.PID, w.State)
		}
	}
	// Escalations move samples between lanes; each is completed once.
	if done != int64(len(want)) {
		t.Errorf("workers completed %d samples together, want %d", done, len(want))
	}
	host, _ := os.Hostname()
	if res := regenEnv(t, dir, env, "status", "--host", host, "job.yaml"); res.code != 0 || !strings.Contains(res.stdout, "DONE") {
		t.Errorf("status --host %s: exit %d, want 0 DONE\n%s", host, res.code, res)
	}
	if res := regenEnv(t, dir, env, "status", "--host", "no-such-node", "job.yaml"); res.code != 2 || !strings.Contains(res.stdout, "no worker of this job has run on no-such-node") {
		t.Errorf("status --host no-such-node: exit %d, want 2 DEAD\n%s", res.code, res)
	}
	text := regenEnv(t, dir, env, "status", "job.yaml")
	t.Logf("regen status:\n%s", text.stdout)
	// Three runs on one host that all ended: the newest is the runner
	// line, the other two one line of history, not worker blocks.
	if strings.Contains(text.stdout, "workers:") || !strings.Contains(text.stdout, "earlier runs: 2 (2 finished)") {
		t.Errorf("status text does not sum up the ended runs in one line:\n%s", text.stdout)
	}
}

// TestE2EPostgresStoreLoss stops PostgreSQL under a running worker the way a
// crash would (pg_ctl stop -m immediate) and starts it again: meanwhile the
// worker keeps its results, says DOWN with the store as the cause, and
// `regen status` says the store is unreachable; afterwards it resumes and
// every sample is stored once, with no attempt spent by the outage.
func TestE2EPostgresStoreLoss(t *testing.T) {
	t.Parallel()
	srv := ownPostgres(t) // stopped and restarted here
	dir, want, env, dsn := pgJobOn(t, srv, "storeloss", 200, 8)
	p := startRegenEnv(t, dir, env, "run", "--progress-every", "300ms", "job.yaml")
	if !p.waitLine("ingest: ") {
		t.Fatalf("worker ended before ingest finished:\n%s", p.wait(t))
	}
	// Let requests get in flight, then take the store away.
	time.Sleep(700 * time.Millisecond)
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()

	rep, res := pgStatus(t, dir, env)
	if rep.State != monitor.Down || res.code != 1 || rep.Store == nil || !strings.Contains(strings.Join(rep.Evidence, " "), "store unreachable") {
		t.Errorf("status with the store down: %s exit %d store %+v, want DOWN exit 1 with the store unreachable\n%s", rep.State, res.code, rep.Store, res)
	}
	for !p.hasLine("") || !strings.Contains(p.stdout(), "store down for") {
		if p.exited() {
			t.Fatalf("worker exited while the store was down:\n%s", p.wait(t))
		}
		if time.Since(stopped) > 30*time.Second {
			t.Fatalf("worker never reported the store down:\n%s", p.stdout())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // an outage of a few seconds, with results waiting
	if p.exited() {
		t.Fatalf("worker exited while the store was down:\n%s", p.wait(t))
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("store down for %s", time.Since(stopped).Round(time.Millisecond))

	final := p.wait(t)
	if final.code != 0 {
		t.Fatalf("worker after the store came back:\n%s", final)
	}
	for _, line := range strings.Split(final.stdout, "\n") {
		if strings.Contains(line, "DOWN") {
			t.Logf("view during the outage: %s", line)
			break
		}
	}
	checkExport(t, filepath.Join(dir, "out"), "storeloss", want, false)
	checkAllOnce(t, dsn, "storeloss", len(want))
	rep, res = pgStatus(t, dir, env)
	if rep.State != monitor.Done {
		t.Errorf("status after the run: %s, want DONE\n%s", rep.State, res)
	}
	logText, err := os.ReadFile(filepath.Join(dir, ".regen", "storeloss", "regen.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logText), "store down") || !strings.Contains(string(logText), "store back") {
		t.Errorf("worker log does not record the outage and the return:\n%s", logText)
	}
	ev := regenEnv(t, dir, env, "status", "job.yaml")
	if !strings.Contains(ev.stdout, "store_state store UP") && !strings.Contains(ev.stdout, "store UP") {
		t.Logf("status text (the store_state event may have scrolled out of the last five):\n%s", ev.stdout)
	}
}

// TestE2EPostgresPasswordNeverPrinted: a password given in REGEN_STORE
// reaches the database but never the terminal or the log: not from run,
// status, validate or export, not when the store does not exist yet, and
// not when the server cannot be reached.
func TestE2EPostgresPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	srv := pgtest.Get(t)
	dir, _, _, dsn := pgJob(t, "secret", 20, 25)
	const pw = "Pw-never-shown-81c4"
	withPW := strings.Replace(dsn, "postgres://postgres@", "postgres://postgres:"+pw+"@", 1)
	env := []string{"REGEN_STORE=" + withPW}
	var all []result
	all = append(all, regenEnv(t, dir, env, "status", "job.yaml")) // no store yet
	all = append(all, regenEnv(t, dir, env, "validate", "job.yaml"))
	run := regenEnv(t, dir, env, "run", "job.yaml")
	if run.code != 0 {
		t.Fatalf("run:\n%s", run)
	}
	all = append(all, run, regenEnv(t, dir, env, "status", "--json", "job.yaml"), regenEnv(t, dir, env, "export", "job.yaml"))
	// A server that is not there: the refusal names the store, not the password.
	gone := strings.Replace(withPW, fmt.Sprintf(":%d/", srv.Port), ":1/", 1)
	down := regenEnv(t, dir, []string{"REGEN_STORE=" + gone}, "status", "job.yaml")
	if down.code != 1 || !strings.Contains(down.stdout, "store unreachable") {
		t.Errorf("status with the store unreachable: exit %d, want 1 and DOWN with the store as the cause\n%s", down.code, down)
	}
	all = append(all, down)
	logText, _ := os.ReadFile(filepath.Join(dir, ".regen", "secret", "regen.log"))
	for _, r := range all {
		if strings.Contains(r.stdout+r.stderr, pw) {
			t.Errorf("the password is printed:\n%s", r)
		}
	}
	if strings.Contains(string(logText), pw) {
		t.Errorf("the password is in the log:\n%s", logText)
	}
	if !strings.Contains(run.stdout, "postgres:xxxxx@") {
		t.Errorf("run does not show the store it uses, redacted:\n%s", run.stdout)
	}
}

// TestE2EPostgresOtherJobFile: while one worker runs the job on a shared
// store, a second worker (another host's copy of the job folder) started
// with a job file that changes the answers (here the temperature) is
// refused before any request, exit 1, with the difference; --new-config is
// refused too while the first worker runs, since it would go on storing
// answers of the old configuration. Another job file of the same name in
// the first worker's folder is refused as another job's.
func TestE2EPostgresOtherJobFile(t *testing.T) {
	t.Parallel()
	dir, _, env, _ := pgJob(t, "otherjob", 200, 2)
	changed := strings.Replace(fmt.Sprintf(sharedJob, "otherjob", 2), "quality:", "generation: {temperature: 1.3}\nquality:", 1)
	if err := os.WriteFile(filepath.Join(dir, "hot.yaml"), []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	copyTree(t, dir, host)
	if err := os.WriteFile(filepath.Join(host, "job.yaml"), []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	first := startRegenEnv(t, dir, env, "run", "--drain-timeout", "1s", "job.yaml")
	defer func() {
		_ = first.cmd.Process.Signal(os.Interrupt)
		first.wait(t)
	}()
	if !first.waitLine("ingest: ") {
		t.Fatalf("first worker ended before ingesting:\n%s", first.wait(t))
	}
	second := regenEnv(t, host, env, "run", "job.yaml")
	if second.code != 1 || !strings.Contains(second.stderr, "  generation.temperature: (unset) -> 1.3\n") {
		t.Fatalf("second worker with another job file: want exit 1 and the difference\n%s", second)
	}
	sameFolder := regenEnv(t, dir, env, "run", "hot.yaml")
	if sameFolder.code != 1 || !strings.Contains(sameFolder.stderr, "belongs to job file job.yaml") {
		t.Errorf("another job file of the same name beside the first: want exit 1, refused as another job's\n%s", sameFolder)
	}
	forced := regenEnv(t, host, env, "run", "--new-config", "job.yaml")
	if forced.code != 1 || !strings.Contains(forced.stderr, "stop every worker first") {
		t.Fatalf("--new-config beside a running worker: want exit 1, refused\n%s", forced)
	}
	if first.exited() {
		t.Fatalf("the first worker stopped:\n%s", first.wait(t))
	}
	t.Logf("second worker refused:\n%s", second.stderr)
}
