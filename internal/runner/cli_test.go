package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// status runs `regen status [--json] job.yaml` and returns its output and exit code.
func status(t *testing.T, jobPath string, asJSON bool) (string, int) {
	t.Helper()
	args := []string{"status", jobPath}
	if asJSON {
		args = []string{"status", "--json", jobPath}
	}
	out, err := exec.Command(regenBin, args...).Output()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("regen status: %v", err)
	}
	return string(out), code
}

func statusReport(t *testing.T, jobPath string) (monitor.Report, int) {
	t.Helper()
	out, code := status(t, jobPath, true)
	var r monitor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("regen status --json: %v\n%s", err, out)
	}
	if r.ExitCode != code {
		t.Errorf("status exit code %d, report says %d", code, r.ExitCode)
	}
	return r, code
}

// startRegenRun starts `regen run [flags] job.yaml` as a subprocess.
func startRegenRun(t *testing.T, jobPath string, flags ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	args := append(append([]string{"run", "--progress-every", "1h"}, flags...), jobPath)
	cmd := exec.Command(regenBin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &out
}

// TestRunnerKilled stops a `regen run` subprocess in two ways. SIGKILL:
// `regen status` reports DEAD with the heartbeat's age and exit code 2 at
// once, since the pid is gone from this host. SIGSTOP (a hung runner whose
// pid lives): status reports the last heartbeat's RUNNING (exit 0) until the
// heartbeat is older than monitor.dead_after, then DEAD (exit 2), and a
// re-run refuses while that pid lives. Once the runner is gone, a re-run
// takes over (status RUNNING, exit 0) and completes the job with every
// sample done once.
func TestRunnerKilled(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"SIGKILL": syscall.SIGKILL, "SIGSTOP": syscall.SIGSTOP} {
		t.Run(name, func(t *testing.T) { testRunnerKilled(t, name, sig) })
	}
}

func testRunnerKilled(t *testing.T, name string, sig syscall.Signal) {
	const n = 120
	spec := newJob(t, "inprocess.yaml.tmpl", n, jobParams{Concurrency: 4,
		Sim: map[string]any{"speed": 10, "output_mean": 120, "seed": 7, "load_time": "1s", "warmup_time": "0s"}})
	st := openStore(t, spec)
	first, out := startRegenRun(t, spec.Path)
	waitFor(t, nil, 60*time.Second, "10 samples done by the first runner", func() bool { return countState(t, st, store.Done) >= 10 })
	killedAt := kill(t, first.Process.Pid, sig)
	if sig == syscall.SIGKILL {
		_ = first.Wait()
		t.Logf("first runner output:\n%s", out)
	}
	// A stopped runner is killed at cleanup (startRegenRun), after the re-run.

	var (
		text string
		code int
	)
	polls := 0
	for {
		text, code = status(t, spec.Path, false)
		polls++
		if code != 0 {
			break
		}
		if !strings.Contains(text, "RUNNING") {
			t.Fatalf("status after the %s: exit 0 without RUNNING:\n%s", name, text)
		}
		if time.Since(killedAt) > 30*time.Second {
			t.Fatalf("status still exit 0 30s after the %s:\n%s", name, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
	recordLatency(t, fmt.Sprintf("runner %s to status DEAD after %d polls (dead_after %s)", name, polls, spec.Monitor.DeadAfter), time.Since(killedAt))
	t.Logf("status exit %d:\n%s", code, text)
	if code != 2 || !strings.Contains(text, "DEAD") {
		t.Fatalf("status: exit %d, want 2 and DEAD:\n%s", code, text)
	}
	rep, _ := statusReport(t, spec.Path)
	evidence := strings.Join(rep.Evidence, "; ")
	if rep.State != monitor.Dead || rep.Heartbeat == nil || rep.Heartbeat.PID != first.Process.Pid {
		t.Fatalf("status --json: state %s, heartbeat %+v; want DEAD with pid %d's heartbeat", rep.State, rep.Heartbeat, first.Process.Pid)
	}
	switch {
	case sig == syscall.SIGKILL && !strings.Contains(evidence, "no longer exists"):
		t.Errorf("DEAD evidence %q does not say the runner's pid is gone", evidence)
	case sig == syscall.SIGSTOP && rep.Heartbeat.Age < spec.Monitor.DeadAfter:
		t.Errorf("DEAD with a live pid and a heartbeat %v old, younger than dead_after %s", rep.Heartbeat.Age, spec.Monitor.DeadAfter)
	}
	if !strings.Contains(text, "last heartbeat ") || !strings.Contains(evidence, "last heartbeat ") {
		t.Errorf("status does not give the heartbeat's age: evidence %q, text:\n%s", evidence, text)
	}

	if sig == syscall.SIGSTOP {
		// The hung runner's pid is alive on this host, so it still owns the
		// job: a re-run must refuse rather than take its leases. Once the
		// operator kills it, the re-run takes over.
		refused, err := exec.Command(regenBin, "run", spec.Path).CombinedOutput()
		if err == nil || !strings.Contains(string(refused), fmt.Sprintf("is being run by pid %d", first.Process.Pid)) {
			t.Fatalf("re-run beside a stopped but live runner: err %v, want a refusal naming pid %d:\n%s", err, first.Process.Pid, refused)
		}
		_ = first.Process.Kill()
		_ = first.Wait()
	}
	second, out2 := startRegenRun(t, spec.Path)
	sawRunning := false
	for !sawRunning {
		rep, code := statusReport(t, spec.Path)
		if rep.State == monitor.Running && rep.Heartbeat != nil && rep.Heartbeat.PID == second.Process.Pid {
			sawRunning = true
			if code != 0 {
				t.Errorf("status RUNNING with exit %d, want 0", code)
			}
			t.Logf("re-run RUNNING: %d done, %d pending, %d in flight", rep.Total.Done, rep.Total.Pending, rep.Total.InFlight)
			break
		}
		if rep.State == monitor.Done {
			t.Fatalf("re-run finished before status saw it RUNNING; make the job slower")
		}
		if second.ProcessState != nil || (rep.Heartbeat != nil && rep.Heartbeat.PID == second.Process.Pid && rep.State != monitor.Starting && rep.State != monitor.Running) {
			t.Fatalf("re-run is not running: status %s\n%s", rep.State, out2)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("re-run: %v\n%s", err, out2)
	}
	t.Logf("re-run output:\n%s", out2)
	rep, code = statusReport(t, spec.Path)
	if rep.State != monitor.Done || code != 0 {
		t.Errorf("status after the re-run: %s exit %d, want DONE exit 0", rep.State, code)
	}
	var takeover bool
	for _, e := range events(t, st) {
		if e.Kind == "takeover" {
			takeover = true
			t.Logf("takeover: %s", e.Evidence)
		}
	}
	if !takeover {
		t.Errorf("no takeover event: the re-run released none of the dead runner's leases")
	}
	checkExactlyOnce(t, nil, st, Summary{}, n, 1)
	checkExportOnce(t, export.TrainingFile(spec.Output.Dir, spec.BaseName(), export.FormatShareGPT), n)
}

// TestSGLangDialect launches "sglang" through a stand-in executable that
// records its arguments and runs regen sim with them: regen must build the
// SGLang command line exactly, and the job must complete.
func TestSGLangDialect(t *testing.T) {
	const n = 60
	dir := t.TempDir()
	argvFile := filepath.Join(dir, "argv.txt")
	script := writeScript(t, dir, "sglang-standin", fmt.Sprintf(
		"printf '%%s\\n' \"$@\" > %q\nexec %q sim --profile fast --speed 50 --output-mean 120 --load-time 1s --warmup-time 0s \"$@\"\n", argvFile, regenBin))
	port := freePort(t)
	spec := newJob(t, "sglang.yaml.tmpl", n, jobParams{Script: script, Port: port})
	st := openStore(t, spec)
	sum, err := startRun(t, spec, st, false).wait(t, 60*time.Second)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	b, err := os.ReadFile(argvFile)
	if err != nil {
		t.Fatalf("the stand-in never ran: %v", err)
	}
	got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	want := []string{"--model-path", "org/some-model", "--host", "127.0.0.1", "--port", fmt.Sprint(port),
		"--enable-metrics", "--tp", "8", "--mem-fraction-static", "0.85"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("server argv (-want +got):\n%s", diff)
	}
	starting, ok := firstState(t, st, time.Time{}, "STARTING")
	if wantEv := "argv " + script + " " + strings.Join(want, " "); !ok || !strings.Contains(starting.Evidence, wantEv) {
		t.Errorf("STARTING evidence %q does not contain %q", starting.Evidence, wantEv)
	}
	checkExactlyOnce(t, spec, st, sum, n, 1)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
