package ui

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestHoldShown (issue 30 item 8): a server's 429 hold, with its
// Retry-After and the cut it made to the fixed lanes, shows in status
// (text and JSON) and on watch's endpoint line, not only in the log.
func TestHoldShown(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 1, 2, 3, 0, time.UTC)
	hold := &monitor.Hold{Since: t0, Until: t0.Add(2 * time.Second), Reason: "429 Too Many Requests (Retry-After 2s)", FixedCap: 1}
	r := monitor.Report{State: monitor.Running, Heartbeat: &monitor.HeartbeatInfo{PID: 7, Time: t0},
		Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:30000", State: monitor.Ready, InFlight: 1, Limit: 8, Hold: hold}}}
	want := "held by the server since 01:02:03 until 01:02:05: 429 Too Many Requests (Retry-After 2s); fixed lanes capped at 1 requests, one more per answer"
	if text := StatusText("demo", r); !strings.Contains(text, want) {
		t.Errorf("status lacks %q:\n%s", want, text)
	}
	screen := ansi.Strip(RenderWatch(WatchSnapshot{Job: "demo", Now: t0, Report: r}, PaneProgress, 200, 20))
	if !strings.Contains(screen, "HELD until 01:02:05 (server backpressure)") {
		t.Errorf("watch's endpoint line lacks the hold:\n%s", screen)
	}
	b, err := json.Marshal(r.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"hold":{"since":"2026-12-06T01:02:03Z","until":"2026-12-06T01:02:05Z","reason":"429 Too Many Requests (Retry-After 2s)","fixed_cap":1}`) {
		t.Errorf("endpoint JSON lacks the hold: %s", b)
	}
	// The hold over, the cap remains until answers lift it.
	hold.Until = time.Time{}
	screen = ansi.Strip(RenderWatch(WatchSnapshot{Job: "demo", Now: t0, Report: r}, PaneProgress, 200, 20))
	if !strings.Contains(screen, "capped at 1 (server backpressure)") {
		t.Errorf("watch's endpoint line lacks the cap:\n%s", screen)
	}
}

// TestReplaysShown (issue 30 item 8): keep-alive replays are printed on
// the endpoint's status line.
func TestReplaysShown(t *testing.T) {
	r := monitor.Report{State: monitor.Running, Heartbeat: &monitor.HeartbeatInfo{PID: 7},
		Endpoints: []monitor.EndpointStatus{{URL: "http://127.0.0.1:8080", State: monitor.Ready, Replays: 41}}}
	if text := StatusText("demo", r); !strings.Contains(text, "http://127.0.0.1:8080 READY, in flight 0, 41 keep-alive replays") {
		t.Errorf("status lacks the replays:\n%s", text)
	}
}
