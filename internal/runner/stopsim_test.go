package runner

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// stoppedSimHangAfter is the test's monitor.hang_after (the manual
// run used 10s; short here so the test is quick).
const stoppedSimHangAfter = 2 * time.Second

// TestStoppedExternalSim SIGSTOPs an external `regen sim` (a child process
// regen did not launch) with requests in flight. Its health probe then
// hangs until the 25 s probe timeout, yet the endpoint is STALLED (cause
// hang, its probe unanswered) at hang_after, before any DOWN and long
// before the job-wide stall_after (60s): the hang rule no longer waits for
// the probe. The measured delay is logged.
func TestStoppedExternalSim(t *testing.T) {
	port := freePort(t)
	sim := exec.Command(regenBin, "sim", "--profile", "fast", "--port", strconv.Itoa(port), "--speed", "1", "--load-time", "100ms",
		"--output-mean", "400", "--model-path", "sim-model")
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sim.Process.Signal(syscall.SIGCONT)
		_ = sim.Process.Kill()
		_ = sim.Wait()
	})
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitFor(t, nil, 30*time.Second, "the simulator's /health", func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), 200)
	spec := loadJobYAML(t, dir, fmt.Sprintf(`name: stopped
model: sim-model
endpoints: [{url: %q, engine: sglang}]
sources: [{partition: p, path: prompts.jsonl, prompt: prompt, id: id}]
lanes: [{name: default, concurrency: 4, max_tokens: 512}]
monitor: {heartbeat_every: 200ms, hang_after: %s, probe_every: 500ms, stall_after: 60s}
quality: {truncated: false}
`, url, stoppedSimHangAfter))
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	waitFor(t, r, 60*time.Second, "2 samples done", func() bool { return countState(t, st, store.Done) >= 2 })

	stoppedAt := kill(t, sim.Process.Pid, syscall.SIGSTOP)
	var stalled *store.Event
	waitFor(t, r, 60*time.Second, "the endpoint STALLED", func() bool {
		for _, e := range endpointEvents(t, st, stoppedAt) {
			if e.State == "STALLED" {
				stalled = &e
				return true
			}
		}
		return false
	})
	took := stalled.Time.Sub(stoppedAt)
	t.Logf("SIGSTOP to STALLED: %s (hang_after %s, probe every %s): %s",
		took.Round(time.Millisecond), stoppedSimHangAfter, spec.Monitor.ProbeEvery, stalled.Evidence)
	recordLatency(t, "SIGSTOPped external server to STALLED (hang_after 2s)", took)
	for _, e := range endpointEvents(t, st, stoppedAt) {
		if e.State == "DOWN" && !e.Time.After(stalled.Time) {
			t.Errorf("DOWN (%s) before STALLED: the hang rule waited for the probes", e.Evidence)
		}
	}
	for _, want := range []string{"hang", "no token for", "health probe unanswered"} {
		if !strings.Contains(stalled.Evidence, want) {
			t.Errorf("STALLED evidence %q lacks %q", stalled.Evidence, want)
		}
	}
	for _, e := range events(t, st) {
		if e.Kind == "job_state" && e.State == "STALLED" && strings.Contains(e.Evidence, "no token received for") {
			t.Errorf("the job-wide stall timer fired (%s): the endpoint's hang rule should have", e.Evidence)
		}
	}
}
