package runner

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/testfs"
)

// fill writes zeros to a file in dir until its filesystem is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "ballast"))
	if err != nil {
		t.Fatalf("create ballast: %v", err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v, want ENOSPC", dir, err)
			}
			return
		}
	}
}

// fullDiskJob is a job whose SQLite store sits on a 6 MB tmpfs, with the
// job file, its log and the simulator elsewhere; the simulator is slow, so
// requests are in flight when the disk fills.
func fullDiskJob(t *testing.T) (spec *job.Spec, fsDir string) {
	t.Helper()
	fsDir = testfs.Tmpfs(t, 6<<20)
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 400)
	spec = loadJobYAML(t, dir, fmt.Sprintf(`name: full
model: sim-model
sources:
  - {partition: p, path: prompts.jsonl, prompt: prompt, id: id}
lanes:
  - {name: default, concurrency: 4, max_tokens: 256}
server:
  engine: sim
  sim: {profile: fast, speed: 2, output_mean: 200, seed: 7, load_time: 100ms, warmup_time: 0s}
store: {dsn: %s}
monitor: {heartbeat_every: 500ms, dead_after: 3s, stall_after: 60s}
output: {formats: [sharegpt]}
quality: {truncated: false}
`, filepath.Join(fsDir, "job.db")))
	return spec, fsDir
}

// cpuTicks is a process's user+system CPU time in clock ticks, from
// /proc/PID/stat.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("read stat of %d: %v", pid, err)
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux.
const clockTicks = 100

// storeLogLines counts the run log's lines about the store being down or back.
func storeLogLines(t *testing.T, spec *job.Spec) (outage, total int) {
	t.Helper()
	b, err := os.ReadFile(spec.LogPath())
	if err != nil {
		t.Fatalf("read run log: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		total++
		if strings.Contains(l, `msg="store down`) || strings.Contains(l, `msg="store back"`) || strings.Contains(l, `msg="store still down`) {
			outage++
		}
	}
	return outage, total
}

// TestFullDiskRunner fills the filesystem under a running job's SQLite
// store (a real tmpfs; reads still work, every write fails). The runner
// must neither spin nor flood its log: an outage ends only on a successful
// write, so reads no longer end and reopen it thousands of times a second.
// The run log gets a bounded number of outage lines (the runner's and the
// dispatcher's first line) over 15 s of outage; the CPU used is reported.
// Then SIGINT with the results held in memory: the runner exits after the
// drain timeout, not a second one later (reported; the bound itself is
// asserted with fake time in dispatch's TestRun).
func TestFullDiskRunner(t *testing.T) {
	spec, cmd, out := startFullDisk(t)
	before, _ := storeLogLines(t, spec)
	_, linesBefore := storeLogLines(t, spec)
	ticks0, t0 := cpuTicks(t, cmd.Process.Pid), time.Now()
	time.Sleep(15 * time.Second)
	ticks1, t1 := cpuTicks(t, cmd.Process.Pid), time.Now()
	after, linesAfter := storeLogLines(t, spec)
	cpu := float64(ticks1-ticks0) / clockTicks / t1.Sub(t0).Seconds()
	t.Logf("full disk for %s: runner used %.2f%% of a core; %d outage lines in the run log (%d during the window), %d log lines in all during the window",
		t1.Sub(t0).Round(time.Millisecond), 100*cpu, after, after-before, linesAfter-linesBefore)
	// One line each from the runner and the dispatcher when the outage
	// begins; reminders come after a minute. Before the fix: thousands.
	if after > 4 {
		t.Errorf("%d store outage lines in the run log, want at most 4 (one outage):\n%s", after, logTail(t, spec))
	}
	if n := linesAfter - linesBefore; n > 10 {
		t.Errorf("%d log lines in %s of a full disk, want at most 10:\n%s", n, t1.Sub(t0).Round(time.Second), logTail(t, spec))
	}

	start := time.Now()
	kill(t, cmd.Process.Pid, syscall.SIGINT)
	err := cmd.Wait()
	took := time.Since(start)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("regen run after SIGINT: %v, want exit 130 (interrupted)\n%s", err, out.String())
	}
	t.Logf("SIGINT during the outage: exited after %s with --drain-timeout 3s", took.Round(time.Millisecond))
	if !strings.Contains(out.String(), "interrupted") {
		t.Errorf("run output does not say it was interrupted:\n%s", out.String())
	}
}

// startFullDisk starts `regen run` on fullDiskJob, lets it finish a few
// samples, fills the store's filesystem and waits for the outage in the
// run log.
func startFullDisk(t *testing.T) (*job.Spec, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	spec, fsDir := fullDiskJob(t)
	st := openStore(t, spec)
	cmd, out := startRegenRun(t, spec.Path, "--drain-timeout", "3s")
	waitFor(t, nil, 60*time.Second, "5 samples done", func() bool { return countState(t, st, store.Done) >= 5 })
	fill(t, fsDir)
	waitFor(t, nil, 30*time.Second, "the outage in the run log", func() bool { n, _ := storeLogLines(t, spec); return n > 0 })
	return spec, cmd, out
}

// TestFullDiskStatus: while a live runner cannot write its store (a real
// full tmpfs), `regen status` from another process says DOWN with the
// store as the cause, read from the runner's note beside the job, once the
// heartbeat in the store is older than dead_after; not DEAD with "re-run
// to resume" (a re-run would be refused beside the live runner). Once the
// runner is killed, its note no longer counts: DEAD, the process gone.
func TestFullDiskStatus(t *testing.T) {
	spec, cmd, _ := startFullDisk(t)
	var rep monitor.Report
	var code int
	waitFor(t, nil, 30*time.Second, "a heartbeat older than dead_after", func() bool {
		rep, code = statusReport(t, spec.Path)
		return rep.Heartbeat != nil && rep.Heartbeat.Age > spec.Monitor.DeadAfter
	})
	evidence := strings.Join(rep.Evidence, "\n")
	t.Logf("status with a heartbeat %s old: %s (exit %d)\n%s", rep.Heartbeat.Age.Round(time.Millisecond), rep.State, code, evidence)
	if rep.State != monitor.Down || code != 1 {
		t.Errorf("status = %s exit %d, want DOWN exit 1:\n%s", rep.State, code, logTail(t, spec))
	}
	for _, want := range []string{"store cannot be written", "disk is full", fmt.Sprintf("runner pid %d", cmd.Process.Pid), "is alive"} {
		if !strings.Contains(evidence, want) {
			t.Errorf("evidence %q lacks %q", evidence, want)
		}
	}
	if strings.Contains(evidence, "re-run") {
		t.Errorf("evidence %q tells the user to re-run beside a live runner", evidence)
	}
	if rep.Store == nil || rep.Store.State != monitor.Down || !strings.Contains(rep.Store.Cause, "disk is full") {
		t.Errorf("report's store = %+v, want DOWN with the disk-full cause", rep.Store)
	}
	if text, _ := status(t, spec.Path, false); !strings.Contains(text, "DOWN") || !strings.Contains(text, "store") {
		t.Errorf("status text does not say DOWN with the store:\n%s", text)
	}

	kill(t, cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	rep, code = statusReport(t, spec.Path)
	if rep.State != monitor.Dead || code != 2 || !strings.Contains(strings.Join(rep.Evidence, " "), "no longer exists") {
		t.Errorf("status after SIGKILL = %s exit %d %q, want DEAD exit 2, the process gone", rep.State, code, rep.Evidence)
	}
}

// logTail is the end of the run log, for a failure message.
func logTail(t *testing.T, spec *job.Spec) string {
	t.Helper()
	b, _ := os.ReadFile(spec.LogPath())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
