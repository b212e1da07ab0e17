package runner

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// openShared opens a job's schema in a fresh database on the package's
// PostgreSQL server, and returns the database's DSN for more workers.
func openShared(t *testing.T, job string) (*postgres.Store, string) {
	t.Helper()
	dsn := pgtest.Get(t).Database(t)
	return openWorker(t, dsn, job), dsn
}

// openWorker opens another worker's handle on a job's schema.
func openWorker(t *testing.T, dsn, job string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{Schema: postgres.SchemaFor(job)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestDeadWorkerSamplesReturnWithinDeadAfter: a worker on another host holds
// samples with hour-long leases and stops beating; a live worker returns
// them to pending once that heartbeat is dead_after old, not when the leases
// run out, and finishes the job. Beside it, a worker that exited cleanly is
// left alone, and a live one is never robbed.
func TestDeadWorkerSamplesReturnWithinDeadAfter(t *testing.T) {
	spec := newJob(t, "inprocess.yaml.tmpl", 40, jobParams{Name: "rescue"})
	spec.Monitor.HeartbeatEvery = 100 * time.Millisecond
	spec.Monitor.DeadAfter = time.Second
	st, _ := openShared(t, spec.Name)
	ctx := context.Background()
	if _, err := Ingest(ctx, spec, st); err != nil {
		t.Fatal(err)
	}
	held, err := st.Claim(ctx, "default", 10, "ghost", time.Hour)
	if err != nil || len(held) != 10 {
		t.Fatalf("ghost claim: %d, %v", len(held), err)
	}
	beat, _ := json.Marshal(monitor.Beat{State: monitor.Running})
	// Fresh now: the live worker must wait for it to go stale.
	if err := st.PutHeartbeat(ctx, store.Heartbeat{Owner: "ghost", PID: 4242, Host: "other-host", Time: time.Now(), Started: time.Now(), Counters: beat}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sum, err := startRun(t, spec, st, true).wait(t, 2*time.Minute)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	took := time.Since(start)
	if sum.Final.Total.Done != 40 {
		t.Errorf("done %d, want 40 (the ghost's samples finished by the live worker)", sum.Final.Total.Done)
	}
	if took > time.Minute {
		t.Errorf("run took %s: the ghost's samples waited for their hour-long leases", took)
	}
	events, err := st.Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range events {
		if e.Kind == "takeover" && strings.Contains(e.Evidence, "released 10 samples leased by worker pid 4242 on other-host") {
			found = true
			if e.Worker == "" {
				t.Errorf("takeover event not tagged with the worker that recorded it: %+v", e)
			}
		}
	}
	if !found {
		t.Errorf("no takeover event for the ghost's 10 samples; events: %+v", events)
	}
	rows, _, err := finishedIDs(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range held {
		if rows[c.ID] != 1 {
			t.Errorf("ghost sample %s finished %d times, want 1", c.ID, rows[c.ID])
		}
	}
	t.Logf("the ghost's %d samples came back; run took %s (dead_after %s)", len(held), took.Round(time.Millisecond), spec.Monitor.DeadAfter)
}

// finishedIDs counts finished rows per id and their attempts.
func finishedIDs(st store.Store) (map[string]int, int, error) {
	out := map[string]int{}
	attempts := 0
	err := st.Finished(context.Background(), func(r store.Row) error {
		out[r.ID]++
		attempts += r.Attempts
		return nil
	})
	return out, attempts, err
}

// TestSharedWorkersSplitLanes: two workers on one store, one per lane; the
// short lane's worker finishes its lane, waits for the other lane, and only
// one of them exports.
func TestSharedWorkersSplitLanes(t *testing.T) {
	spec := newJob(t, "inprocess.yaml.tmpl", 15, jobParams{Name: "split"})
	spec.Monitor.HeartbeatEvery = 100 * time.Millisecond
	// The same prompts in two partitions, one lane each.
	spec.Sources = append(spec.Sources, spec.Sources[0])
	spec.Sources[1].Partition = "q"
	spec.Lanes = append(spec.Lanes, spec.Lanes[0])
	spec.Lanes[0].Partitions = []string{"p"}
	spec.Lanes[1].Name, spec.Lanes[1].Partitions = "long", []string{"q"}
	st1, dsn := openShared(t, spec.Name)
	st2 := openWorker(t, dsn, spec.Name)

	type res struct {
		sum Summary
		err error
	}
	run := func(st store.Store, lanes []string) chan res {
		ch := make(chan res, 1)
		go func() {
			sum, err := Run(context.Background(), Options{Spec: spec, Store: st, Lanes: lanes, ProgressEvery: time.Hour, DrainTimeout: time.Second, Logger: testLogger(t)})
			ch <- res{sum, err}
		}()
		return ch
	}
	a, b := run(st1, []string{"default"}), run(st2, []string{"long"})
	ra, rb := <-a, <-b
	if ra.err != nil || rb.err != nil {
		t.Fatalf("runs: %v / %v", ra.err, rb.err)
	}
	files := len(ra.sum.Export.Files) + len(rb.sum.Export.Files)
	if len(ra.sum.Export.Files) > 0 && len(rb.sum.Export.Files) > 0 || files == 0 {
		t.Errorf("export files: %d by the short worker, %d by the long one; want exactly one exporter",
			len(ra.sum.Export.Files), len(rb.sum.Export.Files))
	}
	counts, err := st1.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byLane := map[string]int{}
	for _, c := range counts {
		if c.State != store.Done {
			t.Errorf("cell %+v not done", c)
		}
		byLane[c.Lane] += c.N
	}
	if byLane["default"] != 15 || byLane["long"] != 15 {
		t.Errorf("done per lane %v, want 15 in each", byLane)
	}
	hbs, err := st1.Heartbeats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, hb := range hbs {
		var b monitor.Beat
		_ = json.Unmarshal(hb.Counters, &b)
		if len(b.Lanes) != 1 || !b.Exited || b.ExitReason != monitor.ExitFinished {
			t.Errorf("worker %s: lanes %v, exited %v (%s); want one lane each, finished", hb.Owner, b.Lanes, b.Exited, b.ExitReason)
		}
	}
}
