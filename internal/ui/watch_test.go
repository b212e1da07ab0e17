package ui

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/monitor"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func ptr(v float64) *float64 { return &v }

func watchFixture() WatchSnapshot {
	now := time.Date(2025, 3, 1, 12, 30, 15, 0, time.UTC)
	h := monitor.History{BucketSeconds: 60}
	ep := monitor.EndpointHistory{URL: "http://127.0.0.1:30000"}
	for i := range 60 {
		h.Times = append(h.Times, now.Truncate(time.Minute).Add(time.Duration(i-59)*time.Minute).Unix())
		v := float64(i % 20)
		h.TokensPerSec = append(h.TokensPerSec, 100*v)
		h.RequestsPerSec = append(h.RequestsPerSec, v/2)
		var kv *float64
		if i > 10 {
			kv = ptr(float64(i) / 60)
		}
		ep.KVUsage = append(ep.KVUsage, kv)
		ep.Queued = append(ep.Queued, ptr(float64(i%7)))
		ep.TokensPerSec = append(ep.TokensPerSec, 100*v)
	}
	h.Endpoints = []monitor.EndpointHistory{ep}
	return WatchSnapshot{
		Job: "demo",
		Now: now,
		Report: monitor.Report{
			State:     monitor.Running,
			Heartbeat: &monitor.HeartbeatInfo{PID: 4242, Host: "gpu-box", Age: 1200 * time.Millisecond},
			Cells: []monitor.CellCounts{
				{Partition: "B1_glaive", Lane: "short", Total: 300, Done: 207, Pending: 60, InFlight: 28, Rejected: 3, Dead: 2},
				{Partition: "B2_opencode", Lane: "long", Total: 300, Done: 45, Pending: 245, InFlight: 10},
			},
			Total:        monitor.CellCounts{Total: 600, Done: 252, Pending: 305, InFlight: 38, Rejected: 3, Dead: 2},
			Rejects:      []monitor.RuleCount{{Rule: "truncated", N: 2}, {Rule: "think_tags", N: 1}},
			Rate1m:       monitor.Rate{Window: time.Minute, SamplesPerSec: 4.25, TokensPerSec: 1843.5},
			Rate10m:      monitor.Rate{Window: 10 * time.Minute, SamplesPerSec: 3.9, TokensPerSec: 1702.1},
			ETA:          78 * time.Second,
			IngestErrors: 3,
			Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:30000", State: monitor.Ready, InFlight: 38,
				Since: now.Add(-5 * time.Minute), Load: &monitor.Load{KVUsage: ptr(0.87), Queued: ptr(4), Running: ptr(38)}, Restarts: 1,
				Limit: 48, LimitReason: "short: raise 40 -> 44: goodput rising, no pressure (queue 2, kv 0.81)", KVTokens: 231120, KVTokensSource: "server",
				Lanes: []monitor.LaneLimit{{Lane: "short", InFlight: 28, Limit: 44, Auto: true}, {Lane: "long", InFlight: 10, Limit: 4, Auto: true, Ceiling: 6}}}},
			Events: []monitor.Event{
				{Time: now.Add(-5 * time.Minute), Kind: "endpoint_state", Subject: "http://127.0.0.1:30000", State: "READY"},
				{Time: now.Add(-6 * time.Minute), Kind: "endpoint_state", Subject: "http://127.0.0.1:30000", State: "DOWN", Evidence: "exit code 137"},
			},
			LastErrors: []monitor.ErrorLine{{ID: "B1_glaive/glaive-00042", State: "dead", Reason: "400: context too long"}},
		},
		History: h,
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	got = ansi.Strip(got) + "\n"
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/ui -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

func TestRenderWatchGolden(t *testing.T) {
	down := watchFixture()
	down.Report.State = monitor.Down
	down.Report.Evidence = []string{"http://127.0.0.1:30000 DOWN (requests fail: connection refused)"}
	down.Report.Endpoints[0].State = monitor.Down
	down.Report.Endpoints[0].Cause = "requests fail: connection refused"
	down.Report.Endpoints[0].Load = nil
	down.Report.ETA, down.Report.ETANote = 0, "none while DOWN: nothing is progressing"
	stale := watchFixture()
	stale.Err = errors.New("database is locked")
	// Two live workers on a PostgreSQL store and one that died.
	workers := watchFixture()
	workers.Report.Workers = []monitor.WorkerStatus{
		{Host: "gpu-a", PID: 101, State: monitor.Running, Live: true, HeartbeatAge: 2 * time.Second, Done: 150, Rate: 2.5, InFlight: 20,
			Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:30000", State: monitor.Ready}}},
		{Host: "gpu-b", PID: 202, State: monitor.Running, Live: true, HeartbeatAge: time.Second, Done: 102, Rate: 1.75, InFlight: 18, Lanes: []string{"long"},
			Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:30001", State: monitor.Ready}}},
		{Host: "gpu-c", PID: 303, State: monitor.Dead, HeartbeatAge: 95 * time.Second, Done: 12,
			Evidence:  []string{"heartbeat 1m35s old (dead after 30s); its leases went back to pending"},
			Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:30002", State: monitor.Down, Cause: "exit code 137"}}},
	}
	// The runner was SIGKILLed: its endpoints and leases are as of its
	// last heartbeat, its rates those of its last minutes.
	died := watchFixture()
	died.Report.State = monitor.Dead
	died.Report.RunnerDied = true
	died.Report.Heartbeat.Age = 40 * time.Second
	died.Report.Heartbeat.Time = died.Now.Add(-40 * time.Second)
	died.Report.Evidence = []string{"last heartbeat 40s ago (deadline 30s) from pid 4242 on gpu-box", "process 4242 no longer exists", "343 samples remaining; re-run to resume"}
	died.Report.ETA, died.Report.ETANote = 0, "none while DEAD: nothing is progressing"
	// Many events, for a tall terminal to fill.
	tall := watchFixture()
	for i := range 30 {
		tall.Events = append(tall.Events, monitor.Event{Time: tall.Now.Add(-time.Duration(i) * time.Minute), Kind: "limit", Subject: "http://127.0.0.1:30000",
			Evidence: fmt.Sprintf("short: raise %d -> %d: goodput rising, no pressure", 40+i, 44+i)})
	}
	// Generation finished; the hidden-state capture is under way.
	capture := watchFixture()
	capTotal := 2000
	capture.Report.Capture = &monitor.CaptureProgress{Total: &capTotal, Captured: 1234, Dead: 3, InFlight: 4, Pending: 5, Bytes: 12_300_000_000, Tokens: 1_234_567}
	empty := WatchSnapshot{Job: "fresh", Now: watchFixture().Now, Report: monitor.Report{State: monitor.Dead,
		Evidence: []string{"no runner has ever written a heartbeat for this job"}}}
	for _, tc := range []struct {
		name string
		s    WatchSnapshot
		pane Pane
		w, h int
	}{
		{"watch_running", watchFixture(), PaneProgress, 120, 40},
		{"watch_endpoints", watchFixture(), PaneEndpoints, 120, 40},
		{"watch_events", watchFixture(), PaneEvents, 120, 40},
		{"watch_down", down, PaneProgress, 120, 40},
		{"watch_narrow", watchFixture(), PaneProgress, 60, 12},
		{"watch_stale", stale, PaneProgress, 120, 8},
		{"watch_empty", empty, PaneProgress, 100, 20},
		{"watch_workers", workers, PaneProgress, 120, 50},
		{"watch_workers_endpoints", workers, PaneEndpoints, 120, 50},
		{"watch_80x24", watchFixture(), PaneProgress, 80, 24},
		{"watch_80x24_endpoints", watchFixture(), PaneEndpoints, 80, 24},
		{"watch_100x30", watchFixture(), PaneProgress, 100, 30},
		{"watch_200x60", tall, PaneProgress, 200, 60},
		{"watch_died_80x24", died, PaneProgress, 80, 24},
		{"watch_died_200x60", died, PaneProgress, 200, 60},
		{"watch_capture_80x24", capture, PaneProgress, 80, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := RenderWatch(tc.s, tc.pane, tc.w, tc.h)
			lines := strings.Split(out, "\n")
			if len(lines) > tc.h {
				t.Errorf("%d lines for a %d-line terminal", len(lines), tc.h)
			}
			for i, l := range lines {
				if w := ansi.StringWidth(l); w > tc.w {
					t.Errorf("line %d is %d cells wide for a %d-cell terminal: %q", i, w, tc.w, ansi.Strip(l))
				}
			}
			golden(t, tc.name, out)
		})
	}
}

// TestWatchKeys: tab cycles the panes, q quits, and a failed read keeps
// the last good snapshot on screen with the error.
func TestWatchKeys(t *testing.T) {
	calls := 0
	m := &watchModel{ctx: context.Background(), every: time.Second, load: func(context.Context) (WatchSnapshot, error) {
		calls++
		if calls == 2 {
			return WatchSnapshot{}, errors.New("disk gone")
		}
		return watchFixture(), nil
	}}
	m.Update(m.Init()())
	if !m.have || m.snap.Job != "demo" {
		t.Fatalf("after the first read: have=%v job=%q", m.have, m.snap.Job)
	}
	_, cmd := m.Update(tickMsg{})
	m.Update(cmd())
	if m.snap.Job != "demo" || m.snap.Err == nil || !strings.Contains(m.View().Content, "disk gone") {
		t.Errorf("after a failed read the view lost its data or hides the error:\n%s", m.View().Content)
	}
	for i, want := range []Pane{PaneEndpoints, PaneEvents, PaneProgress} {
		m.Update(tea.KeyPressMsg{Code: tea.KeyTab})
		if m.pane != want {
			t.Errorf("after %d tabs pane = %d, want %d", i+1, m.pane, want)
		}
	}
	_, cmd = m.Update(tea.KeyPressMsg{Code: 'q', Text: "q"})
	if cmd == nil {
		t.Fatal("q returned no command")
	}
	if _, ok := cmd().(tea.QuitMsg); !ok {
		t.Errorf("q did not quit")
	}
}

// TestSparkFillsWidth: a job younger than the sparkline's width in
// buckets is drawn across the whole width, not as bars at its right edge.
func TestSparkFillsWidth(t *testing.T) {
	got := ansi.Strip(spark([]float64{1, 8, 4}, 10))
	if want := " ▂▂▂███▅▅▅"; got != want {
		t.Errorf("spark of 3 buckets in 10 cells = %q, want %q", got, want)
	}
	if got := ansi.Strip(spark([]float64{1, 2, 3, 4}, 3)); got != "▅▆█" {
		t.Errorf("spark of 4 buckets in 3 cells = %q, want the last three", got)
	}
}
