package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/capture"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/testfs"
)

// captureJob generates with a launched simulator (token ids on) and
// captures from a vLLM simulator the test runs (capture.endpoints).
const captureJobYAML = `name: cap
model: sim-model
server:
  engine: sim
  sim: {speed: 400, output_mean: 16, seed: 11}
sources:
  - {partition: A, path: a.jsonl, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 64, max_tokens: 64}
output:
  formats: [sharegpt]
  token_ids: true
quality: {truncated: false}
capture:
  endpoints: [{url: %s}]
  concurrency: 4
  layers: 2
  hidden: 16
  dtype: bf16
  down_after: 2m
`

// startCaptureSim runs a vLLM simulator writing hidden states (2 layers
// of 16, bf16) into dir, with fault on every fault-every-th file.
func startCaptureSim(t *testing.T, dir string, speed float64, fault string) string {
	t.Helper()
	c := sim.DefaultConfig()
	c.Engine, c.Speed, c.LoadTime, c.WarmupTime, c.ModelName = sim.EngineVLLM, speed, 0, 0, "sim-model"
	c.HiddenStates, c.HiddenSize, c.HiddenLayers, c.HiddenDType = dir, 16, 2, "bf16"
	c.HiddenStatesFault = fault
	s, err := sim.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	url, err := s.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Close() })
	return url
}

func writeCaptureJob(t *testing.T, dir, url string, n int) []string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(captureJobYAML, url)), 0o644); err != nil {
		t.Fatal(err)
	}
	return writeChaosSource(t, filepath.Join(dir, "a.jsonl"), "A", n, rand.New(rand.NewPCG(5, 6)))
}

// capturedRows reads the capture table.
func capturedRows(t *testing.T, db *sql.DB) (done, other int) {
	t.Helper()
	rows, err := db.Query(`SELECT state, count(*) FROM captures GROUP BY state`)
	if err != nil {
		return 0, 0 // not created yet
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			t.Fatal(err)
		}
		if st == "done" {
			done += n
		} else {
			other += n
		}
	}
	return done, other
}

// TestE2ECaptureKill generates 2,000 samples, then SIGKILLs the capture
// ten times at random moments (in regen run after generation, and in
// regen capture alone), and checks the end state: exactly one recorded
// file per sample, every file in the folder recorded once and none
// missing, every sha256 matching, every file's token ids those of its
// exported training row, and no attempt spent by a kill.
func TestE2ECaptureKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 2,000-sample capture with ten kills; skipped with -short")
	}
	rng := chaosRNG(t, 0x63617074)
	dir := t.TempDir()
	url := startCaptureSim(t, filepath.Join(dir, "server_out"), 50, "")
	want := writeCaptureJob(t, dir, url, 2000)
	db := openStoreRO(t, filepath.Join(dir, "cap.db"))

	kills, progressed := 0, false
	for i := 0; kills < 10; i++ {
		if i == 20 {
			t.Fatalf("only %d of 20 runs were killed during the capture", kills)
		}
		args, started := []string{"capture", "--progress-every", "100ms", "job.yaml"}, "regen: capture of job "
		if i%3 == 0 {
			args, started = []string{"run", "job.yaml"}, "capture: hidden states of the done samples"
		}
		p := startRegen(t, dir, args...)
		if !p.waitLine(started) {
			t.Fatalf("run %d never reached the capture:\n%s", i+1, p.wait(t))
		}
		before, _ := capturedRows(t, db)
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		res := p.wait(t)
		after, held := capturedRows(t, db)
		if !p.killed() {
			if res.code != 0 {
				t.Fatalf("run %d ended on its own with an error:\n%s", i+1, res)
			}
			t.Logf("run %d (%s) finished before its kill: %d captured", i+1, args[0], after)
			break
		}
		kills++
		for _, l := range strings.Split(res.stdout, "\n") {
			progressed = progressed || (strings.HasPrefix(l, "capture: ") && strings.Contains(l, " of 2000 captured, "))
		}
		t.Logf("kill %2d (regen %s): SIGKILL after %s, captured %d -> %d, %d leased or pending", kills, args[0],
			res.dur.Round(time.Millisecond), before, after, held)
	}
	if kills < 10 {
		t.Fatalf("only %d runs were killed during the capture before it finished; want 10", kills)
	}
	if !progressed {
		t.Error("no regen capture printed a progress line (capture: N of 2000 captured, ...)")
	}
	// The last run captures what is left, then exports (the manifest and
	// the training rows the files are checked against).
	final := regen(t, dir, "run", "job.yaml")
	line := ""
	for _, l := range strings.Split(final.stdout, "\n") {
		if strings.HasPrefix(l, "capture: ") && strings.Contains(l, " rows with token ids") {
			line = l
		}
	}
	if final.code != 0 || !strings.Contains(line, "2000 rows with token ids") || !strings.Contains(line, " 0 dead;") {
		t.Fatalf("final run:\n%s", final)
	}
	t.Logf("%d kills; final: %s", kills, line)
	checkCaptured(t, dir, db, want)
	if res := regen(t, dir, "verify", "job.yaml"); res.code != 0 {
		t.Errorf("regen verify after the kills:\n%s", res)
	}
	sums := exec.Command("sha256sum", "--quiet", "-c", "cap.hidden_states.sha256")
	sums.Dir = filepath.Join(dir, "out")
	if out, err := sums.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c from the manifest's folder: %v\n%s", err, out)
	}
	// A kill after the server answered and before regen settled the file
	// leaves it (and the connector's lock) in the server's folder; the
	// key's row names it and the run that claims the key again removes
	// both, and a placed file's lock is removed at once. What a kill can
	// still leave is the file of a request the server finished after regen
	// died, whose answer (and path) regen never read: one per request in
	// flight (capture.concurrency 4) at most, each with its lock.
	files, locks, orphans := serverLeftovers(t, filepath.Join(dir, "server_out"))
	t.Logf("left in the server's folder after %d kills: %d files, %d lock files (%d without their file)", kills, files, locks, orphans)
	if orphans > 0 {
		t.Errorf("%d lock files without their file in the server's folder: regen settled a file and left its lock", orphans)
	}
	if files > 4*kills {
		t.Errorf("%d files left in the server's folder, more than the %d requests in flight at %d kills", files, 4*kills, kills)
	}
}

// serverLeftovers counts the hidden-state files and lock files under a
// capture server's output folder, and the lock files whose file is gone.
func serverLeftovers(t *testing.T, dir string) (files, locks, orphans int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
		case strings.HasSuffix(p, ".lock"):
			locks++
			if _, err := os.Lstat(strings.TrimSuffix(p, ".lock")); errors.Is(err, fs.ErrNotExist) {
				orphans++
			}
		default:
			files++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, locks, orphans
}

// checkCaptured checks the capture of every sample in want against the
// store, the folder and the exported training rows.
func checkCaptured(t *testing.T, dir string, db *sql.DB, want []string) {
	t.Helper()
	ids := exportedIDs(t, dir)
	rows, err := db.Query(`SELECT key, sample_id, turn, state, path, bytes, sha256, attempts FROM captures ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	listed := map[string]bool{}
	n := 0
	for rows.Next() {
		var key, sample, state, path, sum string
		var turn, attempts int
		var size int64
		if err := rows.Scan(&key, &sample, &turn, &state, &path, &size, &sum, &attempts); err != nil {
			t.Fatal(err)
		}
		n++
		if state != "done" || key != sample || turn != -1 || attempts != 0 || listed[path] {
			t.Errorf("%s: state %s, sample %s, turn %d, attempts %d, path %s listed before: %v", key, state, sample, turn, attempts, path, listed[path])
		}
		listed[path] = true
		b, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		got := sha256.Sum256(b)
		if hex.EncodeToString(got[:]) != sum || int64(len(b)) != size {
			t.Errorf("%s: %s holds %d bytes with sha256 %x, recorded %d bytes %s", key, path, len(b), got, size, sum)
		}
		if _, err := capture.CheckFile(filepath.Join(dir, path), ids[key], capture.Expect{Layers: 2, Hidden: 16, DType: "bf16"}); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
	if n != len(want) {
		t.Errorf("%d captures recorded, want one per sample: %d", n, len(want))
	}
	entries, err := os.ReadDir(filepath.Join(dir, "hidden_states"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !listed[filepath.Join("hidden_states", e.Name())] {
			t.Errorf("hidden_states/%s is in the folder but not recorded", e.Name())
		}
	}
	if len(entries) != len(listed) {
		t.Errorf("%d files in the folder, %d recorded", len(entries), len(listed))
	}
}

// exportedIDs reads each training row's input_ids from the ShareGPT
// files (answers cut at max_tokens are in the truncated file beside it).
func exportedIDs(t *testing.T, dir string) map[string][]int64 {
	t.Helper()
	out := map[string][]int64{}
	for _, raw := range doneLines(t, filepath.Join(dir, "out"), "cap") {
		var row struct {
			ID       string  `json:"id"`
			InputIDs []int64 `json:"input_ids"`
		}
		if err := json.Unmarshal(raw, &row); err != nil {
			t.Fatal(err)
		}
		out[row.ID] = row.InputIDs
	}
	return out
}

// TestE2ECaptureFaults: each fault the capture simulator injects into
// every file (or answer) makes regen capture exit 1 naming the fault's
// kind for the first dead sample, every sample dead after
// capture.max_attempts with that kind as its evidence, and nothing placed.
func TestE2ECaptureFaults(t *testing.T) {
	t.Parallel()
	gen := t.TempDir()
	writeCaptureJob(t, gen, "http://127.0.0.1:1", 6)
	// Generation only: the same job without its capture: section.
	genOnly := captureJobYAML[:strings.Index(captureJobYAML, "capture:")]
	if err := os.WriteFile(filepath.Join(gen, "job.yaml"), []byte(genOnly), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := regen(t, gen, "run", "--no-export", "job.yaml"); res.code != 0 || !strings.Contains(res.stdout, "regen: job cap done: 6 samples") {
		t.Fatalf("generation:\n%s", res)
	}
	for _, tt := range []struct{ fault, kind string }{
		{sim.HiddenFaultNaN, capture.KindNaN},
		{sim.HiddenFaultWrongIDs, capture.KindTokenIDs},
		{sim.HiddenFaultMissing, capture.KindMissing},
		{sim.HiddenFaultTruncated, capture.KindTruncated},
		{sim.HiddenFaultWrongPromptIDs, capture.KindPromptIDs},
		{sim.HiddenFaultSlow, capture.KindSlow},
	} {
		t.Run(tt.fault, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			url := startCaptureSim(t, filepath.Join(dir, "server_out"), 1, tt.fault) // slow: the file ends 2 s after the answer
			for _, f := range []string{"a.jsonl", "cap.db"} {
				b, err := os.ReadFile(filepath.Join(gen, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			job := strings.Replace(fmt.Sprintf(captureJobYAML, url), "  down_after: 2m\n", "  down_after: 2m\n  max_attempts: 2\n  file_wait: 500ms\n", 1)
			if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
				t.Fatal(err)
			}
			res := regen(t, dir, "capture", "job.yaml")
			if res.code != 1 || !strings.Contains(res.stderr, "6 of 6 rows dead (first: A/a-00000: "+tt.kind+": ") {
				t.Fatalf("capture with fault %s: want exit 1 naming %q\n%s", tt.fault, tt.kind, res)
			}
			// regen run, with generation finished, exports and captures:
			// the dead captures fail it too.
			if res := regen(t, dir, "run", "job.yaml"); res.code != 1 || !strings.Contains(res.stderr, "6 of 6 rows dead (first: A/a-00000: "+tt.kind+": ") {
				t.Errorf("regen run after the capture failed: want exit 1 naming %q\n%s", tt.kind, res)
			}
			db := openStoreRO(t, filepath.Join(dir, "cap.db"))
			rows, err := db.Query(`SELECT key, state, attempts, last_error FROM captures`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			n := 0
			for rows.Next() {
				var key, state, evidence string
				var attempts int
				if err := rows.Scan(&key, &state, &attempts, &evidence); err != nil {
					t.Fatal(err)
				}
				n++
				if state != "dead" || attempts != 2 || !strings.HasPrefix(evidence, tt.kind+": ") {
					t.Errorf("%s: %s after %d attempts, evidence %q; want dead after 2 naming %s", key, state, attempts, evidence, tt.kind)
				}
			}
			if entries, _ := os.ReadDir(filepath.Join(dir, "hidden_states")); n != 6 || len(entries) != 0 {
				t.Errorf("%d captures recorded (want 6 dead), %d files placed (want 0)", n, len(entries))
			}
		})
	}
}

// TestE2ECaptureRefusesWhatDoesNotFit: a capture whose files cannot fit
// the free space of capture.dir (a 1 MB tmpfs; 6 files of about 9 MB at
// 4 layers of 4096 bf16) is refused with the numbers before any request.
func TestE2ECaptureRefusesWhatDoesNotFit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	small := testfs.Tmpfs(t, 1<<20)
	serverOut := filepath.Join(dir, "server_out")
	url := startCaptureSim(t, serverOut, 50, "")
	writeCaptureJob(t, dir, url, 6)
	job := fmt.Sprintf(captureJobYAML, url)
	job = strings.Replace(job, "  layers: 2\n  hidden: 16\n", "  layers: 4\n  hidden: 4096\n  dir: "+small+"\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 1 || !strings.Contains(res.stderr, "hidden-state capture needs") || !strings.Contains(res.stderr, "free") {
		t.Fatalf("run with a capture that does not fit: want exit 1 with the numbers\n%s", res)
	}
	if entries, _ := os.ReadDir(serverOut); len(entries) != 0 {
		t.Errorf("%d files on the capture server: the refusal came after requests were sent", len(entries))
	}
	t.Logf("refusal: %s", strings.TrimSpace(res.stderr))
}
