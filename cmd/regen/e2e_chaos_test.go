package main

import (
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// chaosJob has two partitions in two lanes; A's truncated answers escalate
// from short to long, so kills also land on escalated samples.
const chaosJob = `name: chaos
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 25, output_mean: 200, truncate_fraction: 0.1, seed: 7}
sources:
  - {partition: A, path: a.jsonl, prompt: question, id: id}
  - {partition: B, path: b.jsonl.gz, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 48, max_tokens: 256}
  - {name: long, concurrency: 24, max_tokens: 1024, partitions: [B]}
output:
  formats: [sharegpt, openai-batch]
  metadata: full
# Every sample must end done in one attempt: an answer cut in the long lane
# counts here (the test is about kills, not answer quality).
quality: {truncated: false}
`

const chaosPerPartition = 1200

// writeChaosSource writes n rows {id, question} for partition p and
// returns the sample ids regen must produce for them.
func writeChaosSource(t *testing.T, path, p string, n int, rng *rand.Rand) []string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var w io.Writer = f
	var zw *gzip.Writer
	if strings.HasSuffix(path, ".gz") {
		zw = gzip.NewWriter(f)
		w = zw
	}
	enc := json.NewEncoder(w)
	ids := make([]string, 0, n)
	for i := range n {
		id := fmt.Sprintf("%s-%05d", strings.ToLower(p), i)
		q := fmt.Sprintf("Question %d of %s: %s", i, p, strings.Repeat("explain the trade-offs ", 3+rng.IntN(60)))
		if err := enc.Encode(map[string]string{"id": id, "question": q}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p+"/"+id)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// killPoint is one planned SIGKILL of the runner.
type killPoint struct {
	phase string        // ingest, dispatch, near-end, export
	delay time.Duration // after the phase's trigger
}

// TestE2EChaosKill kills the runner with SIGKILL at random points of a
// 2,400-sample job (during ingest, mid-dispatch, near the end and during
// the export), re-runs it each time, and then checks that every sample came
// out exactly once, intact, with no attempt spent by the kills.
func TestE2EChaosKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("chaos test runs a 2,400-sample job with a dozen kills; skipped with -short")
	}
	rng := chaosRNG(t, 0x7265676e)

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(chaosJob), 0o644); err != nil {
		t.Fatal(err)
	}
	want := writeChaosSource(t, filepath.Join(dir, "a.jsonl"), "A", chaosPerPartition, rng)
	want = append(want, writeChaosSource(t, filepath.Join(dir, "b.jsonl.gz"), "B", chaosPerPartition, rng)...)
	total := len(want)

	var plan []killPoint
	for range 2 {
		plan = append(plan, killPoint{"ingest", time.Duration(rng.IntN(30)) * time.Millisecond})
	}
	for range 8 {
		plan = append(plan, killPoint{"dispatch", 200*time.Millisecond + time.Duration(rng.IntN(1800))*time.Millisecond})
	}
	plan = append(plan, killPoint{"near-end", time.Duration(rng.IntN(50)) * time.Millisecond})
	plan = append(plan, killPoint{"export", 0})

	dbPath := filepath.Join(dir, "chaos.db")
	outDir := filepath.Join(dir, "out")
	var db *sql.DB
	counts := func() string {
		if db == nil {
			if _, err := os.Stat(dbPath); err != nil {
				return "no store yet"
			}
			db = openStoreRO(t, dbPath)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := storeCounts(ctx, db)
		if err != nil {
			return "counts unreadable: " + err.Error()
		}
		return fmt.Sprintf("done %d/%d, leased %d, pending %d", c["done"], total, c["leased"], c["pending"])
	}
	lastIngested := 0
	ingested := func() (int, bool) {
		if db == nil {
			if _, err := os.Stat(dbPath); err != nil {
				return 0, false
			}
			db = openStoreRO(t, dbPath)
		}
		c, err := storeCounts(context.Background(), db)
		if err != nil {
			return 0, false // the schema may not exist yet
		}
		return c["done"] + c["pending"] + c["leased"], true
	}
	remaining := func() (int, bool) {
		if db == nil {
			return 0, false
		}
		c, err := storeCounts(context.Background(), db)
		if err != nil || c["done"]+c["pending"]+c["leased"] < total {
			return 0, false // not readable or not fully ingested yet
		}
		return c["pending"] + c["leased"], true
	}

	start := time.Now()
	kills := 0
	for i, k := range plan {
		p := startRegen(t, dir, "run", "job.yaml")
		runStart := time.Now()
		switch k.phase {
		case "ingest":
			// Kill once a batch more than last time is committed but not
			// all: the runner is between ingest transactions.
			p.waitLine("regen: job ")
			time.Sleep(k.delay)
			for !p.exited() && !p.hasLine("ingest: ") {
				if n, ok := ingested(); ok && n > lastIngested && n < total {
					lastIngested = n
					break
				}
				time.Sleep(time.Millisecond)
			}
		case "dispatch":
			p.waitLine("ingest: ")
			time.Sleep(k.delay)
		case "near-end":
			p.waitLine("ingest: ")
			counts() // open the store
			for !p.exited() {
				if n, ok := remaining(); ok && n <= 30 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(k.delay)
		case "export":
			// The export writes hidden temporary files named after the
			// runner's pid; kill the runner as soon as one appears.
			tmp := fmt.Sprintf(".tmp-%d", p.cmd.Process.Pid)
			for !p.exited() && !hasFileContaining(outDir, tmp) {
				time.Sleep(time.Millisecond)
			}
		}
		before := ""
		if k.phase != "export" {
			before = counts()
		}
		if k.phase == "ingest" {
			before += fmt.Sprintf(" (ingested %d)", lastIngested)
		}
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		res := p.wait(t)
		if !p.killed() {
			t.Logf("kill %2d (%s, delay %s): runner finished first (exit %d after %s); not a kill",
				i+1, k.phase, k.delay, res.code, res.dur.Round(time.Millisecond))
			if res.code != 0 {
				t.Fatalf("run %d ended on its own with an error:\n%s", i+1, res)
			}
			continue
		}
		kills++
		phase := "during ingest"
		switch {
		case strings.Contains(res.stdout, "ingest: "):
			phase = "during dispatch"
		case !strings.Contains(res.stdout, "regen: job "):
			phase = "before the store was open"
		}
		if k.phase == "export" {
			before = counts()
			if hasFileContaining(outDir, fmt.Sprintf(".tmp-%d", p.cmd.Process.Pid)) {
				phase = "during export"
			}
		}
		t.Logf("kill %2d (%-8s delay %-6s): SIGKILL after %-7s %s; store: %s", i+1, k.phase, k.delay,
			time.Since(runStart).Round(time.Millisecond), phase, before)
		switch phase {
		case "during dispatch":
			// On the runner's host a vanished pid is DEAD at once.
			if rep, res := status(t, dir, "job.yaml"); rep.State != monitor.Dead || res.code != 2 {
				t.Errorf("status after kill %d: %s exit %d, want DEAD exit 2\n%s", i+1, rep.State, res.code, res)
			}
		case "during export":
			// Every sample is done but the files are not written: that is
			// not DONE, it is a dead runner with an export still owed.
			rep, res := status(t, dir, "job.yaml")
			_, err := os.Stat(filepath.Join(outDir, "data", "chaos.sharegpt.jsonl"))
			t.Logf("status after the kill during export: %s exit %d; sharegpt file exists: %v", rep.State, res.code, err == nil)
			if err != nil && (rep.State != monitor.Dead || res.code != 2) {
				t.Errorf("status after a kill during export with no output yet: %s exit %d, want DEAD exit 2\n%s", rep.State, res.code, res)
			}
		}
	}
	if kills < 10 {
		t.Fatalf("only %d of %d planned kills hit a running runner; want >= 10", kills, len(plan))
	}

	final := regen(t, dir, "run", "job.yaml")
	if final.code != 0 {
		t.Fatalf("final run:\n%s", final)
	}
	if !strings.Contains(final.stdout, ": 0 new samples, 2400 already stored,") {
		t.Errorf("final run ingested new samples after the kills:\n%s", final.stdout)
	}
	t.Logf("%d kills; final run %s; whole chaos sequence %s", kills, final.dur.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	ex := checkExport(t, outDir, "chaos", want, false)
	escalated := 0
	for _, r := range ex.shareGPT {
		if r.Attempts != 1 {
			t.Errorf("sharegpt %s: attempts %d, want 1 (kills must not spend attempts)", r.ID, r.Attempts)
		}
		if r.Partition == "A" && r.Lane == "long" {
			escalated++
		}
	}
	t.Logf("export: %d rows (%d short, %d long), %d escalated from short to long, %d truncated in long", len(ex.shareGPT), ex.lanes["short"], ex.lanes["long"], escalated, ex.truncated)
	if escalated == 0 {
		t.Errorf("no sample escalated from short to long; the job is meant to exercise escalation")
	}

	rep, res := status(t, dir, "job.yaml")
	if res.code != 0 || rep.State != monitor.Done {
		t.Errorf("status: exit %d state %s, want 0 DONE\n%s", res.code, rep.State, res)
	}
	if rep.Total.Total != total || rep.Total.Done != total || rep.Total.Pending != 0 || rep.Total.InFlight != 0 || rep.Total.Dead != 0 || rep.Total.Rejected != 0 {
		t.Errorf("status counts %+v; want %d total, all done, none pending or in flight", rep.Total, total)
	}

	rows, results := storeRows(t, dbPath)
	checkRowsOnce(t, rows, results, total)
}

// hasFileContaining reports whether dir holds a file whose name contains s.
func hasFileContaining(dir, s string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), s) {
			return true
		}
	}
	return false
}
