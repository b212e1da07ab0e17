package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/regen-dev/regen/internal/monitor"
)

// noOpRerun is the report after a re-run that redid nothing: the rates
// are the working run's (pid 16204, 22 s), the newest run (pid 18031)
// exited having sent nothing.
func noOpRerun() monitor.Report {
	t0 := time.Date(2026, 12, 6, 0, 43, 4, 0, time.UTC)
	return monitor.Report{State: monitor.Done, RunnerExited: true,
		Heartbeat: &monitor.HeartbeatInfo{PID: 18031, Host: "vm", Time: t0.Add(26 * time.Second), Started: t0.Add(26 * time.Second)},
		Rate1m:    monitor.Rate{Window: 22 * time.Second, Samples: 600, Tokens: 662138, SamplesPerSec: 27.14, TokensPerSec: 29949.3},
		Rate10m:   monitor.Rate{Window: 22 * time.Second, Samples: 600, Tokens: 549498, SamplesPerSec: 27.14, TokensPerSec: 24854.5},
		RatesRun:  &monitor.RunSpan{Started: t0, Ended: t0.Add(22 * time.Second), PIDs: []int{16204}, Earlier: true, IdlePID: 18031},
	}
}

// TestViewsNameTheEarlierRun (issue 30 item 3): after a no-op re-run,
// status and watch show the last working run's figures and say whose,
// never a rate of the idle run.
func TestViewsNameTheEarlierRun(t *testing.T) {
	r := noOpRerun()
	status := StatusText("demo", r)
	want := "rates and charts: the last run that did work, pid 16204, 00:43:04 to 00:43:26 UTC (the newest run, pid 18031, sent nothing)"
	if !strings.Contains(status, want) {
		t.Errorf("status lacks %q:\n%s", want, status)
	}
	screen := ansi.Strip(RenderWatch(WatchSnapshot{Job: "demo", Now: time.Now(), Report: r}, PaneProgress, 200, 40))
	for _, want := range []string{
		"tokens/s    0 now (the newest run, pid 18031, sent nothing); the last run that did work, pid 16204, 00:43:04 to 00:43:26 UTC, 29949.3 in its last 22s",
		"samples/s   0 now; 27.14 in its last 22s",
	} {
		if !strings.Contains(screen, want) {
			t.Errorf("watch lacks %q:\n%s", want, screen)
		}
	}
	// A young run's rate says it is over the seconds it has had.
	r = monitor.Report{State: monitor.Running, Heartbeat: &monitor.HeartbeatInfo{PID: 1},
		Rate1m: monitor.Rate{Window: 3 * time.Second, TokensPerSec: 900}, Rate10m: monitor.Rate{Window: 3 * time.Second, TokensPerSec: 800}}
	screen = ansi.Strip(RenderWatch(WatchSnapshot{Job: "demo", Now: time.Now(), Report: r}, PaneProgress, 200, 40))
	if want := "tokens/s    900.0 now (its first 3s), 800.0 over its first 3s"; !strings.Contains(screen, want) {
		t.Errorf("watch lacks %q:\n%s", want, screen)
	}
}

// TestWatchShowsDashboardAddress (issue 30 item 4): `regen watch --web`
// shows where its dashboard is inside the full-screen view, which hides
// what was printed before it.
func TestWatchShowsDashboardAddress(t *testing.T) {
	s := WatchSnapshot{Job: "demo", Now: time.Now(), Report: monitor.Report{State: monitor.Running}, Dashboard: "http://127.0.0.1:8080/ (metrics at /metrics)"}
	screen := ansi.Strip(RenderWatch(s, PaneProgress, 120, 40))
	if !strings.Contains(screen, "dashboard at http://127.0.0.1:8080/ (metrics at /metrics)") {
		t.Errorf("watch view lacks the dashboard's address:\n%s", screen)
	}
}
