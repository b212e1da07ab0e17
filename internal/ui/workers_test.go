package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/monitor"
)

// restarts is a single-host job run n times, newest first: the newest in
// state newest, the others stopped by Ctrl-C except every tenth, killed.
func restarts(n int, newest monitor.State, live bool) []monitor.WorkerStatus {
	t0 := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	ws := make([]monitor.WorkerStatus, n)
	for i := range ws {
		s := monitor.Stopped
		if i%10 == 5 {
			s = monitor.Dead
		}
		ws[i] = monitor.WorkerStatus{Host: "box", PID: 1000 + n - i, State: s, HeartbeatAt: t0.Add(-time.Duration(i) * time.Minute)}
	}
	ws[0].State, ws[0].Live = newest, live
	return ws
}

// TestWorkerGroups: ended runs of one host are one history line, not
// worker blocks; a shared job shows its live workers and a dead host's
// last run.
func TestWorkerGroups(t *testing.T) {
	shared := []monitor.WorkerStatus{
		{Host: "gpu-a", PID: 1, State: monitor.Running, Live: true},
		{Host: "gpu-b", PID: 2, State: monitor.Running, Live: true},
		{Host: "gpu-c", PID: 3, State: monitor.Dead},
		{Host: "gpu-a", PID: 4, State: monitor.Stopped},
		{Host: "gpu-c", PID: 5, State: monitor.Dead},
	}
	for _, tc := range []struct {
		name        string
		ws          []monitor.WorkerStatus
		wantPIDs    []int
		wantHistory string
		wantSection bool
	}{
		{"one run", restarts(1, monitor.Running, true), []int{1001}, "", false},
		{"40 restarts, running", restarts(40, monitor.Running, true), []int{1040},
			"earlier runs: 39 (35 stopped, 4 dead), the last ended 05:59:00", false},
		{"40 restarts, the last killed", restarts(40, monitor.Dead, false), nil,
			"earlier runs: 39 (35 stopped, 4 dead), the last ended 05:59:00", false},
		{"shared: two live, a dead host", shared, []int{1, 2, 3}, "earlier runs: 2 (1 stopped, 1 dead)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shown, history, section := workerGroups(tc.ws)
			var pids []int
			for _, w := range shown {
				pids = append(pids, w.PID)
			}
			if diff := cmp.Diff(tc.wantPIDs, pids); diff != "" {
				t.Errorf("worker blocks (-want +got pids):\n%s", diff)
			}
			if history != tc.wantHistory || section != tc.wantSection {
				t.Errorf("history %q section %v, want %q %v", history, section, tc.wantHistory, tc.wantSection)
			}
		})
	}
}

// TestStatusTextManyRestarts: `regen status` of a single-runner job after
// 40 restarts prints no "0 live of 40" and no dead-worker blocks, only the
// runner line and one line of history.
func TestStatusTextManyRestarts(t *testing.T) {
	ws := restarts(40, monitor.Dead, false)
	r := monitor.Report{State: monitor.Dead, Workers: ws,
		Heartbeat: &monitor.HeartbeatInfo{PID: ws[0].PID, Host: "box", Age: time.Minute}}
	for name, text := range map[string]string{
		"status": StatusText("demo", r),
		"watch":  RenderWatch(WatchSnapshot{Job: "demo", Report: r}, PaneProgress, 120, 40),
	} {
		if strings.Contains(text, "workers:") || strings.Contains(text, "pid 1039") {
			t.Errorf("%s lists ended runs as workers:\n%s", name, text)
		}
		if n := strings.Count(text, "earlier runs: 39 (35 stopped, 4 dead)"); n != 1 {
			t.Errorf("%s: history line %d times, want once:\n%s", name, n, text)
		}
	}
}
