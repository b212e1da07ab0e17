package supervise

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/engine"
)

func TestFatalLineWhileAliveIsDown(t *testing.T) {
	cfg := fastConfig(t, "--log-fatal-after", "300ms")
	cfg.FatalGrace = 500 * time.Millisecond
	cfg.Server.Restart.Max = 1
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	down := r.rec.waitFor(t, Down, 1, 20*time.Second)
	if down.Cause != engine.CauseHealthCheckFailed {
		t.Errorf("DOWN cause = %q, want %q", down.Cause, engine.CauseHealthCheckFailed)
	}
	r.rec.waitFor(t, Failed, 1, 20*time.Second)
	ev := strings.Join(r.sup.Status().Evidence, "\n")
	if !strings.Contains(ev, "log: ") || !strings.Contains(ev, "Health check failed.") {
		t.Errorf("evidence lacks the fatal log line:\n%s", ev)
	}
}

func TestFrequentRetractionsDegrade(t *testing.T) {
	cfg := fastConfig(t, "--retract-every", "50ms")
	cfg.RetractsPerMinute = 5
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	deg := r.rec.waitFor(t, Degraded, 1, 20*time.Second)
	if deg.Cause != CauseRetractions {
		t.Errorf("DEGRADED cause = %q, want %q", deg.Cause, CauseRetractions)
	}
	r.stopAndCheck(t)
}

func TestGPUReleaseWait(t *testing.T) {
	dir := t.TempDir()
	smi := filepath.Join(dir, "nvidia-smi")
	// Lists the recorded pids on its first 3 calls, then nothing: GPU memory released.
	script := fmt.Sprintf(`#!/bin/sh
n=$(cat %[1]s/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s/count
[ "$1" = "--query-compute-apps=pid" ] || exit 2
if [ $n -le 3 ] && [ -f %[1]s/pids ]; then cat %[1]s/pids; fi
exit 0
`, dir)
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(t, "--fork-child")
	cfg.NvidiaSMI = smi
	cfg.gpuPoll = 50 * time.Millisecond
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	leader := r.sup.Status().PID
	if err := os.WriteFile(filepath.Join(dir, "pids"), []byte(strconv.Itoa(leader)+"\n99999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "count"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscallKill(leader); err != nil {
		t.Fatal(err)
	}
	r.rec.waitFor(t, Ready, 2, 20*time.Second)
	raw, _ := os.ReadFile(filepath.Join(dir, "count"))
	if n, _ := strconv.Atoi(strings.TrimSpace(string(raw))); n < 4 {
		t.Errorf("nvidia-smi called %d times, want >= 4 (until the old pid left the GPU)", n)
	}
	r.stopAndCheck(t)
}

func TestReadStat(t *testing.T) {
	m, pg, ok := readStat(os.Getpid(), make([]byte, 512))
	if !ok || pg <= 0 || !m.alive() || m.PID != os.Getpid() {
		t.Fatalf("readStat(self) = %+v pgid %d ok %v", m, pg, ok)
	}
	if _, _, ok := readStat(1<<30, make([]byte, 512)); ok {
		t.Errorf("readStat of a missing pid: ok = true")
	}
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		failures int
		want     time.Duration
	}{{1, 5 * time.Second}, {2, 10 * time.Second}, {3, 20 * time.Second}, {7, 5 * time.Minute}, {100, 5 * time.Minute}}
	for _, tt := range tests {
		if got := backoff(5*time.Second, 5*time.Minute, tt.failures); got != tt.want {
			t.Errorf("backoff(5s, 5m, %d) = %v, want %v", tt.failures, got, tt.want)
		}
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"A=1", "PATH=/bin", "B=2"}, map[string]string{"PATH": "/opt/bin", "Z": "26", "C": "3"})
	want := []string{"A=1", "B=2", "C=3", "PATH=/opt/bin", "Z=26"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mergeEnv mismatch (-want +got):\n%s", diff)
	}
}

func TestRotatingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	rf, err := openRotating(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 39) + "\n" // 40 bytes: two fit in 100, the third rotates
	for i := range 7 {
		if _, err := fmt.Fprintf(rf, "%d%s", i, line[1:]); err != nil {
			t.Fatal(err)
		}
	}
	rf.Close()
	sizes := map[string]int{}
	for _, name := range []string{path, path + ".1", path + ".2", path + ".3"} {
		b, err := os.ReadFile(name)
		if err == nil {
			sizes[filepath.Base(name)] = len(b)
		}
	}
	want := map[string]int{"server.log": 40, "server.log.1": 80, "server.log.2": 80}
	if diff := cmp.Diff(want, sizes); diff != "" {
		t.Errorf("rotated file sizes mismatch (-want +got):\n%s", diff)
	}
	cur, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(cur), "6") {
		t.Errorf("current log starts %q, want the newest line 6", cur[:1])
	}
}

func TestLogWatchLongLinesAndCR(t *testing.T) {
	d, _ := engine.Lookup("sglang")
	var out strings.Builder
	w := newLogWatch(d, &out, time.Now)
	long := strings.Repeat("a", 200<<10) // longer than the reader's buffer
	input := "Loading 10%\rLoading 100%\r\n" + long + "\n" + engine.ReadyLineSGLang + "\r\n" +
		"torch.OutOfMemoryError: CUDA out of memory.\n" + "no newline at the end"
	w.run(strings.NewReader(input))
	if out.String() != input {
		t.Errorf("log copy differs from input (len %d vs %d)", out.Len(), len(input))
	}
	if !w.isReady() {
		t.Error("ready line after a long line was not seen")
	}
	cause, lines, _ := w.rootCause()
	if cause != engine.CauseCUDAOOM || len(lines) != 1 {
		t.Errorf("rootCause = %q %q, want %q and one line", cause, lines, engine.CauseCUDAOOM)
	}
	if got := w.lastLines(2); !cmp.Equal(got, []string{"torch.OutOfMemoryError: CUDA out of memory.", "no newline at the end"}) {
		t.Errorf("lastLines(2) = %q", got)
	}
}

// BenchmarkGroupMembers measures one /proc scan, done every PollEvery.
func BenchmarkGroupMembers(b *testing.B) {
	pg := syscallGetpgrp()
	for b.Loop() {
		if _, err := groupMembers(pg); err != nil {
			b.Fatal(err)
		}
	}
}

func TestMissingExecutableFails(t *testing.T) {
	cfg := fastConfig(t)
	cfg.Server.Command = []string{filepath.Join(t.TempDir(), "no-such-server")}
	cfg.Server.Restart.Max = 2
	r := start(t, cfg)
	err := <-r.done
	r.done <- err
	var fe *FailedError
	if !errors.As(err, &fe) || fe.Cause != CauseStart || fe.Failures != 2 {
		t.Fatalf("Run = %v, want *FailedError with cause %q after 2 failures", err, CauseStart)
	}
	want := []State{Down, Restarting, Down, Failed}
	if diff := cmp.Diff(want, r.rec.states()); diff != "" {
		t.Errorf("states mismatch (-want +got):\n%s", diff)
	}
}
