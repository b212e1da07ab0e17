package crew

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

const deadAfter = time.Minute

func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// lease ingests n samples and has owner claim them.
func lease(t *testing.T, st *sqlite.Store, owner string, n int) {
	t.Helper()
	ctx := context.Background()
	var in []store.NewSample
	for i := range n {
		in = append(in, store.NewSample{ID: fmt.Sprintf("%s-%d", owner, i), Partition: "p", Lane: "short", Body: []byte(`{"messages":[]}`), Origin: fmt.Sprintf("f:%d", i)})
	}
	if _, err := st.Ingest(ctx, in); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Claim(ctx, "short", n, owner, time.Hour); err != nil || len(got) != n {
		t.Fatalf("Claim(%s) = %d samples, %v; want %d", owner, len(got), err, n)
	}
}

func beat(t *testing.T, st *sqlite.Store, owner, host string, at time.Time, b monitor.Beat) {
	t.Helper()
	counters, _ := json.Marshal(b)
	// pid 1 on another host: only the heartbeat speaks for the worker.
	if err := st.PutHeartbeat(context.Background(), store.Heartbeat{Owner: owner, PID: 1, Host: host, Time: at, Started: at, Counters: counters}); err != nil {
		t.Fatal(err)
	}
}

func leased(t *testing.T, st *sqlite.Store) int {
	t.Helper()
	counts, err := st.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, total := monitor.Cells(counts)
	return total.InFlight
}

func TestRescueDeadReturnsGoneWorkersLeasesOnce(t *testing.T) {
	ctx := context.Background()
	st := open(t, filepath.Join(t.TempDir(), "job.db"))
	now := time.Now()
	lease(t, st, "exited", 2)
	lease(t, st, "live", 1)
	lease(t, st, "stale", 3)
	beat(t, st, "exited", "node-b", now, monitor.Beat{Exited: true})
	beat(t, st, "live", "node-b", now, monitor.Beat{})
	beat(t, st, "stale", "node-c", now.Add(-2*deadAfter), monitor.Beat{})
	var events []store.Event
	c := New(Config{Store: st, Job: "j", Owner: "me", Host: "node-a", Started: now, Shared: true, DeadAfter: deadAfter,
		Event: func(_ context.Context, e store.Event) { events = append(events, e) }})

	steps := []struct {
		name        string
		reachingFor time.Duration
		want        int // samples released
		leasedAfter int
	}{
		// A stale heartbeat is not trusted from a worker that has not
		// itself reached the store for dead_after (an outage's aftermath).
		{"exited only", 0, 2, 4},
		{"nothing again", 0, 0, 4},
		{"stale once trusted", deadAfter, 3, 1},
		{"the live one stays", deadAfter, 0, 1},
	}
	for _, s := range steps {
		n, err := c.RescueDead(ctx, s.reachingFor)
		if err != nil || n != s.want {
			t.Fatalf("%s: RescueDead = %d, %v; want %d", s.name, n, err, s.want)
		}
		if got := leased(t, st); got != s.leasedAfter {
			t.Fatalf("%s: %d samples leased after, want %d", s.name, got, s.leasedAfter)
		}
	}
	if len(events) != 2 || !strings.Contains(events[0].Evidence, "released 2 samples") || !strings.Contains(events[1].Evidence, "released 3 samples") {
		t.Errorf("events = %+v; want one takeover per gone worker with its count", events)
	}
	// Released, not failed: a claim gets them back with no attempt spent.
	got, err := st.Claim(ctx, "short", 10, "me", time.Hour)
	if err != nil || len(got) != 5 {
		t.Fatalf("Claim after rescue = %d, %v; want 5", len(got), err)
	}
	for _, g := range got {
		if g.Attempts != 0 {
			t.Errorf("%s: %d attempts, want 0", g.ID, g.Attempts)
		}
	}
}

func TestJoinRefusesBesideTheRunnerLockHolder(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "job.db")
	first := New(Config{Store: open(t, path), Job: "j", LockFile: "job.db", Owner: "a", Host: "node-a", DeadAfter: deadAfter})
	second := New(Config{Store: open(t, path), Job: "j", LockFile: "job.db", Owner: "b", Host: "node-a", DeadAfter: deadAfter})
	if err := first.Join(ctx); err != nil {
		t.Fatalf("first Join: %v", err)
	}
	err := second.Join(ctx)
	if err == nil || !strings.Contains(err.Error(), "runner lock in job.db.locks") {
		t.Fatalf("second Join beside the first = %v; want a refusal naming the lock", err)
	}
	first.Leave()
	if err := second.Join(ctx); err != nil {
		t.Fatalf("second Join after the first left: %v", err)
	}
	second.Leave()
}

func TestJoinTakesOverAnExitedRunnersLeases(t *testing.T) {
	ctx := context.Background()
	st := open(t, filepath.Join(t.TempDir(), "job.db"))
	lease(t, st, "old", 4)
	beat(t, st, "old", "node-b", time.Now(), monitor.Beat{Exited: true})
	c := New(Config{Store: st, Job: "j", Owner: "new", Host: "node-a", DeadAfter: deadAfter})
	if err := c.Join(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Leave()
	if got := leased(t, st); got != 0 {
		t.Errorf("%d samples still leased by the exited runner, want 0", got)
	}
}

func TestJoinRefusesBesideAFreshRunnerElsewhere(t *testing.T) {
	ctx := context.Background()
	st := open(t, filepath.Join(t.TempDir(), "job.db"))
	lease(t, st, "other", 2)
	beat(t, st, "other", "node-b", time.Now(), monitor.Beat{})
	c := New(Config{Store: st, Job: "j", Owner: "me", Host: "node-a", DeadAfter: deadAfter})
	err := c.Join(ctx)
	c.Leave()
	if err == nil || !strings.Contains(err.Error(), "pid 1 on node-b") {
		t.Fatalf("Join beside a fresh runner on another host = %v; want a refusal naming it", err)
	}
	if got := leased(t, st); got != 2 {
		t.Errorf("%d samples leased after the refusal, want its 2 untouched", got)
	}
}

func TestExportedByOther(t *testing.T) {
	ctx := context.Background()
	st := open(t, filepath.Join(t.TempDir(), "job.db"))
	started := time.Now()
	cfg := Config{Store: st, Job: "j", Owner: "me", Host: "node-a", Started: started, Shared: true, DeadAfter: deadAfter}
	c := New(cfg)
	mark, err := c.ExportMark(ctx)
	if err != nil || mark != "0 done, 0 rejected, 0 dead, 0 bad rows" {
		t.Fatalf("ExportMark = %q, %v", mark, err)
	}
	cases := []struct {
		name   string
		owner  string
		at     time.Time
		mark   string
		shared bool
		want   bool
	}{
		{"another worker, during this run", "w2", started.Add(time.Second), mark, true, true},
		{"another worker, an earlier run", "w2", started.Add(-time.Second), mark, true, false},
		{"another mark", "w2", started.Add(time.Second), "1 done, 0 rejected, 0 dead, 0 bad rows", true, false},
		{"this worker", "me", started.Add(time.Second), mark, true, false},
		{"a store with one runner", "w2", started.Add(time.Second), mark, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := open(t, filepath.Join(t.TempDir(), "job.db"))
			beat(t, st, tc.owner, "node-b", tc.at, monitor.Beat{Exported: tc.mark})
			cfg := cfg
			cfg.Store, cfg.Shared = st, tc.shared
			got, err := New(cfg).ExportedByOther(ctx, mark)
			if err != nil || got != tc.want {
				t.Errorf("ExportedByOther = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestSharers counts, per endpoint, the live workers sending to it: those
// listing it in their heartbeat and those starting (none listed yet); a
// loopback URL only on this host (elsewhere it is another server); the
// exited, the stale and those sending elsewhere not at all.
func TestSharers(t *testing.T) {
	ctx := context.Background()
	st := open(t, filepath.Join(t.TempDir(), "job.db"))
	now := time.Now()
	const remote, local = "http://gpu1:30000", "http://127.0.0.1:30000"
	eps := func(urls ...string) monitor.Beat {
		var b monitor.Beat
		for _, u := range urls {
			b.Endpoints = append(b.Endpoints, monitor.EndpointStatus{URL: u})
		}
		return b
	}
	beat(t, st, "listing-both", "node-b", now, eps(remote, local))
	beat(t, st, "starting", "node-c", now, monitor.Beat{})
	beat(t, st, "elsewhere", "node-d", now, eps("http://gpu2:30000"))
	beat(t, st, "stale", "node-e", now.Add(-2*deadAfter), eps(remote))
	beat(t, st, "exited", "node-b", now, monitor.Beat{Exited: true, Endpoints: eps(remote).Endpoints})
	// A worker on this host: its heartbeat's pid must be a live regen process.
	standin := exec.Command("sleep", "60")
	standin.Args[0] = "regen-standin"
	if err := standin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standin.Process.Kill(); _ = standin.Wait() })
	counters, _ := json.Marshal(eps(local))
	if err := st.PutHeartbeat(ctx, store.Heartbeat{Owner: "local", PID: standin.Process.Pid, Host: "node-a", Time: now, Started: now, Counters: counters}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: st, Job: "j", Owner: "me", Host: "node-a", Started: now, Shared: true, DeadAfter: deadAfter}
	got, err := New(cfg).Sharers(ctx, []string{remote, local})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{remote: 3, local: 2} // me, listing-both, starting; me, local
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sharers (-want +got):\n%s", diff)
	}
	cfg.Shared = false
	if got, err := New(cfg).Sharers(ctx, []string{remote}); err != nil || got != nil {
		t.Errorf("sharers on a store that is not shared: %v, %v; want none", got, err)
	}
}
