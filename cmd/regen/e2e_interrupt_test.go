package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// interruptJob's answers are long enough (some far longer than the drain
// timeout at this speed) that a SIGINT always finds requests in flight.
const interruptJob = `name: intr
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 4, output_mean: 500, output_sigma: 1.0, truncate_fraction: 0, seed: 3}
sources:
  - {partition: Q, path: q.jsonl, prompt: question, id: id}
lanes:
  - {name: default, concurrency: 32, max_tokens: 4096}
output:
  formats: [sharegpt, openai-batch]
  metadata: full
quality: {truncated: false}
`

// TestE2EInterrupt interrupts a job twice: a double SIGINT exits at once
// (130, status STOPPED); a single SIGINT mid-dispatch drains within
// --drain-timeout and exits 130, status says STOPPED (exit 2). A re-run
// then completes every sample exactly once without spending attempts.
func TestE2EInterrupt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(interruptJob), 0o644); err != nil {
		t.Fatal(err)
	}
	want := writeChaosSource(t, filepath.Join(dir, "q.jsonl"), "Q", 120, rand.New(rand.NewPCG(1, 2)))

	// A second Ctrl-C exits at once, without draining: the runner is gone
	// as if killed, and the next run takes over its leases.
	p := startRegen(t, dir, "run", "job.yaml")
	if !p.waitLine("ingest: ") {
		t.Fatalf("run ended before ingesting:\n%s", p.wait(t))
	}
	db := openStoreRO(t, filepath.Join(dir, "intr.db"))
	c := waitCounts(t, p, db, 5)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	for !p.exited() && !strings.Contains(p.stderr.String(), "draining") {
		time.Sleep(10 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	res := p.wait(t)
	t.Logf("double SIGINT with %d done and %d in flight: exit %d", c["done"], c["leased"], res.code)
	if res.code != 130 || !strings.Contains(res.stderr, "exiting now") {
		t.Fatalf("double interrupt: want exit 130 and 'exiting now'\n%s", res)
	}
	// The runner wrote its last heartbeat before exiting: STOPPED, its
	// leases released.
	if rep, res := status(t, dir, "job.yaml"); rep.State != monitor.Stopped || res.code != 2 || rep.Total.InFlight != 0 {
		t.Errorf("status after a double interrupt: %s exit %d, %d leased; want STOPPED exit 2, 0 leased", rep.State, res.code, rep.Total.InFlight)
	}

	const drain = 5 * time.Second
	p = startRegen(t, dir, "run", "--drain-timeout", drain.String(), "job.yaml")
	if !p.waitLine("ingest: ") {
		t.Fatalf("run ended before ingesting:\n%s", p.wait(t))
	}
	// Interrupt once more samples are done and others are in flight.
	before := waitCounts(t, p, db, c["done"]+20)
	if rep, res := status(t, dir, "job.yaml"); res.code != 0 || (rep.State != monitor.Running && rep.State != monitor.Starting) {
		t.Errorf("status while running: %s exit %d, want RUNNING (or STARTING) exit 0\n%s", rep.State, res.code, res)
	}
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// Well past the drain timeout the runner counts as hung (SIGQUIT dumps
	// its goroutines and wait fails the test).
	p.guard.Reset(drain + 30*time.Second)
	res = p.wait(t)
	took := time.Since(sent)
	t.Logf("SIGINT with %d done and %d in flight; exit %d %s later", before["done"], before["leased"], res.code, took.Round(time.Millisecond))
	if res.code != 130 {
		t.Fatalf("interrupted run: exit %d, want 130\n%s", res.code, res)
	}
	if !strings.Contains(res.stderr, "draining in-flight requests") {
		t.Errorf("interrupted run does not say it drains:\n%s", res.stderr)
	}
	after, err := storeCounts(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if after["leased"] != 0 {
		t.Errorf("after the drain %d samples are still leased, want 0 (drained or released)", after["leased"])
	}
	t.Logf("after the drain: %d done, %d pending", after["done"], after["pending"])

	text := regen(t, dir, "status", "job.yaml")
	if text.code != 2 || !strings.Contains(text.stdout, "job intr: STOPPED") {
		t.Errorf("status after the interrupt: want exit 2 and STOPPED\n%s", text)
	}
	rep, _ := status(t, dir, "job.yaml")
	if rep.State != monitor.Stopped || rep.ExitCode != 2 {
		t.Errorf("status --json: state %s exit_code %d, want STOPPED 2", rep.State, rep.ExitCode)
	}

	// The interrupts are done: the rest runs on a faster simulator (its
	// speed is no part of the configuration).
	editJob(t, filepath.Join(dir, "job.yaml"), "speed: 4,", "speed: 40,")
	rerun := regen(t, dir, "run", "job.yaml")
	if rerun.code != 0 {
		t.Fatalf("re-run:\n%s", rerun)
	}
	t.Logf("re-run finished the job in %s", rerun.dur.Round(time.Millisecond))
	ex := checkExport(t, filepath.Join(dir, "out"), "intr", want, false)
	for _, r := range ex.shareGPT {
		if r.Attempts != 1 {
			t.Errorf("%s: attempts %d, want 1 (an interrupt is not a failure)", r.ID, r.Attempts)
		}
	}
	rep, res = status(t, dir, "job.yaml")
	if res.code != 0 || rep.State != monitor.Done || rep.Total.Done != len(want) {
		t.Errorf("status after the re-run: exit %d state %s total %+v, want DONE with %d done", res.code, rep.State, rep.Total, len(want))
	}
}

// waitCounts polls the store until done >= n with samples in flight; the
// run ending first fails the test.
func waitCounts(t *testing.T, p *proc, db *sql.DB, n int) map[string]int {
	t.Helper()
	for !p.exited() {
		c, err := storeCounts(context.Background(), db)
		if err == nil && c["done"] >= n && c["leased"] > 0 {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("run ended before it could be interrupted:\n%s", p.wait(t))
	return nil
}

// TestE2EDrainTerminal runs a job in a real terminal (tmux) and presses
// Ctrl-C twice. During the drain the view says DRAINING with what it waits
// for (requests in flight, the drain timeout), shows no ETA that grows
// without bound, and `regen status` says DRAINING; the draining line stays
// on screen and in the scrollback. After the second Ctrl-C status says
// STOPPED (the runner wrote its last heartbeat), not DEAD, and no sample
// is left leased.
func TestE2EDrainTerminal(t *testing.T) {
	t.Parallel()
	bin := needTool(t, "tmux", "tmux")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(interruptJob), 0o644); err != nil {
		t.Fatal(err)
	}
	writeChaosSource(t, filepath.Join(dir, "q.jsonl"), "Q", 200, rand.New(rand.NewPCG(5, 6)))
	x := tmux{t: t, bin: bin, socket: fmt.Sprintf("regen-drain-test-%d", os.Getpid())}
	x.run("new-session", "-d", "-s", "watch", "-x", "120", "-y", "40", "-c", dir, regenBin+" run --drain-timeout 30s job.yaml")
	defer exec.Command(bin, "-L", x.socket, "kill-server").Run()
	// Keep the pane after regen exits, to read what it left there.
	x.run("set-option", "-t", "watch", "remain-on-exit", "on")

	deadline := time.Now().Add(90 * time.Second)
	for {
		var rep monitor.Report
		if _, err := os.Stat(filepath.Join(dir, "intr.db")); err == nil {
			rep, _ = status(t, dir, "job.yaml")
		}
		if rep.State == monitor.Running && rep.Total.Done >= 5 && rep.Total.InFlight > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job never ran with requests in flight; screen:\n%s", x.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
	x.run("send-keys", "-t", "watch", "C-c")
	var screen string
	for deadline = time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		screen = x.screen()
		if strings.Contains(screen, "DRAINING") && strings.Contains(screen, "waiting for") {
			break
		}
	}
	t.Logf("during the drain:\n%s", screen)
	if !regexp.MustCompile(`regen intr  DRAINING`).MatchString(screen) ||
		!regexp.MustCompile(`waiting for \d+ requests in flight, up to the drain timeout 30s`).MatchString(screen) {
		t.Errorf("the view does not say DRAINING with what it waits for:\n%s", screen)
	}
	if !strings.Contains(screen, "regen: interrupted: draining") {
		t.Errorf("the draining line is not on screen:\n%s", screen)
	}
	if m := regexp.MustCompile(`\d+h\d+m\d+s`).FindString(screen); m != "" {
		t.Errorf("an ETA of %s during the drain:\n%s", m, screen)
	}
	rep, res := status(t, dir, "job.yaml")
	if rep.State != monitor.Draining || res.code != 0 || rep.ETA != 0 || !strings.Contains(rep.ETANote, "DRAINING") {
		t.Errorf("status during the drain: %s exit %d, ETA %s %q; want DRAINING exit 0, no ETA but why\n%s", rep.State, res.code, rep.ETA, rep.ETANote, res)
	}
	text := regen(t, dir, "status", "job.yaml")
	if !strings.Contains(text.stdout, "job intr: DRAINING") || !strings.Contains(text.stdout, "up to the drain timeout 30s") {
		t.Errorf("status text during the drain:\n%s", text.stdout)
	}

	x.run("send-keys", "-t", "watch", "C-c")
	for deadline = time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out := x.run("display-message", "-p", "-t", "watch", "#{pane_dead}"); strings.TrimSpace(out) == "1" {
			break
		}
	}
	scrollback := x.run("capture-pane", "-p", "-S", "-", "-t", "watch")
	if !strings.Contains(scrollback, "regen: interrupted: draining") || !strings.Contains(scrollback, "regen: exiting now") {
		t.Errorf("the draining and exiting lines are not in the scrollback:\n%s", scrollback)
	}
	rep, res = status(t, dir, "job.yaml")
	t.Logf("status after the second Ctrl-C: %s exit %d, evidence %q", rep.State, res.code, rep.Evidence)
	if rep.State != monitor.Stopped || res.code != 2 {
		t.Errorf("status after the second Ctrl-C: %s exit %d, want STOPPED exit 2\n%s", rep.State, res.code, res)
	}
	if rep.Total.InFlight != 0 {
		t.Errorf("%d samples still leased by the aborted runner, want 0 (released at the abort)", rep.Total.InFlight)
	}
}
