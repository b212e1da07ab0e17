package monitor

import (
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// TestWorkerGone judges heartbeats as a worker on host "a" does: an exited
// worker is gone wherever it ran; on this host a worker is gone when no
// regen process has its pid (a pid reused by another program counts as
// gone); a stale heartbeat makes a worker gone only when its age is
// trusted.
func TestWorkerGone(t *testing.T) {
	// A live process whose command line names regen, as a worker's does.
	cmd := exec.Command("sh", "-c", "sleep 60", "regen-worker")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// A live process that is not regen (a pid reused after a crash).
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })

	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	const deadAfter = time.Minute
	beat := func(exited bool) []byte {
		b, _ := json.Marshal(Beat{Exited: exited})
		return b
	}
	for _, tc := range []struct {
		name     string
		hb       store.Heartbeat
		trustAge bool
		want     bool
	}{
		{"fresh, this host, regen alive", store.Heartbeat{Host: "a", PID: cmd.Process.Pid, Time: now, Counters: beat(false)}, true, false},
		{"exited", store.Heartbeat{Host: "b", PID: 1, Time: now, Counters: beat(true)}, true, true},
		{"this host, pid reused by another program", store.Heartbeat{Host: "a", PID: other.Process.Pid, Time: now, Counters: beat(false)}, true, true},
		{"other host, stale, age trusted", store.Heartbeat{Host: "b", PID: 1, Time: now.Add(-2 * deadAfter), Counters: beat(false)}, true, true},
		{"other host, stale, age not trusted", store.Heartbeat{Host: "b", PID: 1, Time: now.Add(-2 * deadAfter), Counters: beat(false)}, false, false},
		{"other host, fresh", store.Heartbeat{Host: "b", PID: 1, Time: now.Add(-deadAfter / 2), Counters: beat(false)}, true, false},
	} {
		if got := WorkerGone(tc.hb, "a", now, deadAfter, tc.trustAge); got != tc.want {
			t.Errorf("%s: gone = %v, want %v", tc.name, got, tc.want)
		}
	}
}
