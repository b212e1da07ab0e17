package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// killedRunStore makes the starting point in dir: a store whose
// runner was SIGKILLed with requests in flight (its leases held, its
// heartbeat not marked exited).
func killedRunStore(t *testing.T, srv *answerServer, dir string, lane, rows int) {
	t.Helper()
	writeFiles(t, dir, map[string]string{"job.yaml": ownJob(srv.url, lane)})
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), rows)
	srv.hold()
	p := startRegen(t, dir, "run", "job.yaml")
	db := openStoreRO(t, filepath.Join(dir, "own.db"))
	for {
		c, err := storeCounts(context.Background(), db)
		if err == nil && c["leased"] > 0 {
			break
		}
		if p.exited() {
			t.Fatalf("run ended before leasing:\n%s", p.wait(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(t)
	srv.release()
}

// copyStore copies the job directory's files (the job, its prompts and the
// SQLite store with its WAL) into a fresh directory.
func copyStore(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue // the lock directory and the run's logs
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// startPair starts two `regen run` at once on dir while the server holds
// every request, so neither can finish before the other has decided, and
// reports whether both ran at once (each wrote a heartbeat while the other
// was alive) or one was refused beside the other. Then it lets the run
// finish.
func startPair(t *testing.T, srv *answerServer, dir string, beats int) (both bool) {
	t.Helper()
	db := openStoreRO(t, filepath.Join(dir, "own.db"))
	defer db.Close()
	srv.hold()
	ps := []*proc{startRegen(t, dir, "run", "job.yaml"), startRegen(t, dir, "run", "job.yaml")}
	for !ps[0].exited() && !ps[1].exited() {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM heartbeats`).Scan(&n); err == nil && n >= beats+2 {
			both = true
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.release()
	ran, refused := 0, 0
	for _, p := range ps {
		res := p.wait(t)
		switch {
		case res.code == 0:
			ran++
		case res.code == 1 && strings.Contains(res.stderr, "is being run by"):
			refused++
		default:
			t.Errorf("neither a run nor a refusal:\n%s", res)
		}
	}
	if !both && (ran != 1 || refused != 1) {
		t.Errorf("%d ran and %d were refused, want one of each", ran, refused)
	}
	if c, err := storeCounts(context.Background(), db); err != nil || c["done"] != len(readJSONL(t, filepath.Join(dir, "prompts.jsonl"))) {
		t.Errorf("store after the runs: %v (%v), want every sample done", c, err)
	}
	return both
}

// TestE2ESimultaneousStart: two `regen run` started together on a store
// whose runner was SIGKILLed with requests in flight: exactly one runs,
// every time, and the other says who does. 200 tries, in four groups at
// once (each with its own server and store, so the pairs also contend for
// the CPU as a busy host's would); the server holds requests until one of
// the two is refused (or both ran), and never sees more requests at once
// than the lane allows.
func TestE2ESimultaneousStart(t *testing.T) {
	t.Parallel()
	const lane, rows, tries, groups = 4, 4, 200, 4
	var both atomic.Int64
	t.Run("groups", func(t *testing.T) {
		for g := range groups {
			t.Run(fmt.Sprintf("group%d", g), func(t *testing.T) {
				t.Parallel()
				both.Add(int64(simultaneousTries(t, lane, rows, tries/groups)))
			})
		}
	})
	t.Logf("%d tries: exactly one runner %d times, both ran %d times", tries, tries-int(both.Load()), both.Load())
	if both.Load() > 0 {
		t.Errorf("both runners ran in %d of %d tries, want 0", both.Load(), tries)
	}
}

// simultaneousTries starts pairs of runners tries times on copies of one
// killed run's store, each pair against its own answering server, and
// returns how many times both ran.
func simultaneousTries(t *testing.T, lane, rows, tries int) (both int) {
	t.Helper()
	srv := startAnswerServer(t, "The answer is four.")
	template := t.TempDir()
	killedRunStore(t, srv, template, lane, rows)
	db := openStoreRO(t, filepath.Join(template, "own.db"))
	var beats int
	if err := db.QueryRow(`SELECT count(*) FROM heartbeats`).Scan(&beats); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for i := range tries {
		dir := copyStore(t, template)
		srv.peak.Store(0)
		if startPair(t, srv, dir, beats) {
			both++
		}
		if peak := srv.peak.Load(); peak > int64(lane) {
			t.Errorf("try %d: the server had %d requests in flight, over the lane's %d", i, peak, lane)
		}
		if t.Failed() {
			t.Fatalf("try %d failed", i)
		}
	}
	return both
}
