package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestE2EPostgresChaos runs one job of 3,000 samples with three worker
// processes (each with its own simulator) on one PostgreSQL store, kills a
// random worker with SIGKILL at least 30 times (restarting it each time) and
// crashes PostgreSQL itself (pg_ctl stop -m immediate, then start) three
// times during the run. At the end: nothing lost, nothing duplicated, no
// torn line, and no sample spent more than its one attempt.
//
// REGEN_CHAOS_SEED replays a run; REGEN_PG_CHAOS_SAMPLES changes the size
// (per partition, default 1,500).
func TestE2EPostgresChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test runs a 3,000-sample job with 30 kills and 3 database crashes; skipped with -short")
	}
	t.Parallel()
	srv := ownPostgres(t) // crashed and restarted here
	rng := chaosRNG(t, 0x70676368)
	per := 1500
	if s := os.Getenv("REGEN_PG_CHAOS_SAMPLES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("REGEN_PG_CHAOS_SAMPLES: %q", s)
		}
		per = v
	}
	const (
		workers     = 3
		wantKills   = 30
		wantCrashes = 3
	)
	dir, want, env, dsn := pgJobOn(t, srv, "pgchaos", per, 12)
	total := len(want)

	slots := make([]*proc, workers)
	starts := 0
	start := func(i int) {
		slots[i] = startRegenEnv(t, dir, env, "run", "job.yaml")
		starts++
	}
	for i := range slots {
		start(i)
	}
	began := time.Now()
	kills, crashes := 0, 0
	// Database crashes come after kills 8, 16 and 24.
	crashAfter := []int{8, 16, 24}
	finished := func(i int) bool {
		p := slots[i]
		if !p.exited() {
			return false
		}
		res := p.wait(t) // reaps it, so killed() can tell
		return !p.killed() && res.code == 0
	}
	allFinished := func() bool {
		for i := range slots {
			if !finished(i) {
				return false
			}
		}
		return true
	}
	for !allFinished() {
		if time.Since(began) > 4*time.Minute {
			t.Fatalf("chaos run not finished after 4 minutes (%d kills, %d crashes)", kills, crashes)
		}
		time.Sleep(time.Duration(300+rng.IntN(900)) * time.Millisecond)
		// A worker that ended on its own with an error (it was started
		// while the database was down and gave up) is started again, as
		// a scheduler would; one that finished stays finished.
		for i, p := range slots {
			if p.exited() && !finished(i) {
				res := p.wait(t)
				if !p.killed() {
					t.Logf("worker slot %d ended with exit %d on its own; restarting it\n%s", i, res.code, tail([]byte(res.stderr), 600))
				}
				start(i)
			}
		}
		if kills >= wantKills && crashes >= wantCrashes {
			continue // the chaos is done: let the job finish
		}
		var running []int
		for i, p := range slots {
			if !p.exited() {
				running = append(running, i)
			}
		}
		if len(running) == 0 {
			continue
		}
		i := running[rng.IntN(len(running))]
		_ = slots[i].cmd.Process.Signal(syscall.SIGKILL)
		slots[i].wait(t)
		if slots[i].killed() {
			kills++
			start(i)
		}
		if crashes < len(crashAfter) && kills >= crashAfter[crashes] {
			if err := srv.StopImmediate(); err != nil {
				t.Fatal(err)
			}
			down := time.Duration(500+rng.IntN(2000)) * time.Millisecond
			time.Sleep(down)
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			crashes++
			t.Logf("database crash %d after kill %d: down %s (pg_ctl stop -m immediate, then start)", crashes, kills, down.Round(time.Millisecond))
		}
	}
	chaos := time.Since(began)
	if kills < wantKills || crashes < wantCrashes {
		t.Fatalf("the job finished after only %d kills and %d database crashes, want >= %d and >= %d; slow the job down",
			kills, crashes, wantKills, wantCrashes)
	}
	exporters := 0
	for _, p := range slots {
		if strings.Contains(p.wait(t).stdout, "output: sharegpt") {
			exporters++
		}
	}
	t.Logf("%d samples, %d workers: %d SIGKILLs, %d database crashes, %d worker starts; finished after %s; %d of the last workers exported",
		total, workers, kills, crashes, starts, chaos.Round(time.Millisecond), exporters)

	final := regenEnv(t, dir, env, "run", "job.yaml")
	if final.code != 0 {
		t.Fatalf("final run:\n%s", final)
	}
	if !strings.Contains(final.stdout, ": 0 new samples,") {
		t.Errorf("final run ingested new samples after the chaos:\n%s", final.stdout)
	}
	ex := checkExport(t, filepath.Join(dir, "out"), "pgchaos", want, false)
	for _, r := range ex.shareGPT {
		if r.Attempts != 1 {
			t.Errorf("sharegpt %s: attempts %d, want 1 (kills and crashes must not spend attempts)", r.ID, r.Attempts)
		}
	}
	checkAllOnce(t, dsn, "pgchaos", total)
	rep, res := pgStatus(t, dir, env)
	if rep.State != monitor.Done || res.code != 0 {
		t.Errorf("status: %s exit %d, want DONE exit 0\n%s", rep.State, res.code, res)
	}
	if rep.Total.Done != total || rep.Total.Pending != 0 || rep.Total.InFlight != 0 {
		t.Errorf("status counts %+v, want %d done and nothing left", rep.Total, total)
	}
	t.Logf("export: %d rows (%d short, %d long, %d truncated in long); store: %d samples done once, 1 attempt each; %d workers in status",
		len(ex.shareGPT), ex.lanes["short"], ex.lanes["long"], ex.truncated, total, len(rep.Workers))
}
