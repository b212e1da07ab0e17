package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/regen-dev/regen/internal/monitor"
)

func limitedEndpoint(limit int, reason string) monitor.EndpointStatus {
	kv, q, run := 0.93, 12.0, 58.0
	return monitor.EndpointStatus{URL: "http://gpu1:30000", State: monitor.Ready, InFlight: 70, Limit: limit, LimitReason: reason,
		KVTokens: 231120, KVTokensSource: "server", Load: &monitor.Load{KVUsage: &kv, Queued: &q, Running: &run},
		Lanes: []monitor.LaneLimit{{Lane: "short", InFlight: 60, Limit: limit - 32, Auto: true, Ceiling: 120}, {Lane: "long", InFlight: 10, Limit: 32}}}
}

// The progress lines say each endpoint's limit, and why it moved when it did.
func TestProgressShowsLimits(t *testing.T) {
	var b strings.Builder
	p := NewProgress(&b, false)
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cells := []monitor.CellCounts{{Partition: "B1", Lane: "short", Total: 100, Pending: 30, InFlight: 70}}
	why := "short: raise 80 -> 96: room at the server (queue 12 (band 29-87), kv 0.93, in flight 80/80)"
	for i, ep := range []monitor.EndpointStatus{limitedEndpoint(128, why), limitedEndpoint(128, why), limitedEndpoint(112, "short: back off 96 -> 80: retraction burst")} {
		p.Update(monitor.Frame{Time: t0.Add(time.Duration(i) * 10 * time.Second), Job: "demo", State: monitor.Running, Cells: cells, InFlight: 70, Endpoints: []monitor.EndpointStatus{ep}})
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []string{
		"12:00:00 demo RUNNING elapsed=0s in_flight=70 tok/s=0 | B1 0/100 | http://gpu1:30000 limit=128",
		"12:00:00 limit http://gpu1:30000 128: " + why,
		"12:00:10 demo RUNNING elapsed=10s in_flight=70 tok/s=0 | B1 0/100 | http://gpu1:30000 limit=128",
		"12:00:20 demo RUNNING elapsed=20s in_flight=70 tok/s=0 | B1 0/100 | http://gpu1:30000 limit=112",
		"12:00:20 limit http://gpu1:30000 112: short: back off 96 -> 80: retraction burst",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("progress lines:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	var tb strings.Builder
	NewProgress(&tb, true).Update(monitor.Frame{Time: t0, Job: "demo", State: monitor.Running, Cells: cells, Endpoints: []monitor.EndpointStatus{limitedEndpoint(128, why)}})
	for _, w := range []string{"endpoint http://gpu1:30000 READY, in flight 70 of 128\n", "    limit: " + why + "\n"} {
		if !strings.Contains(tb.String(), w) {
			t.Errorf("terminal view lacks %q:\n%s", w, tb.String())
		}
	}
}

func TestStatusShowsLimits(t *testing.T) {
	r := monitor.Report{Job: "demo", State: monitor.Running, Endpoints: []monitor.EndpointStatus{limitedEndpoint(128, "short: raise 80 -> 96: room at the server")}}
	text := StatusText("demo", r)
	for _, w := range []string{
		"    KV pool 231120 tokens (server), 93% used, 58 running, 12 queued\n",
		"    limit 128 (short 96 auto, ceiling 120; long 32 fixed): short: raise 80 -> 96: room at the server\n",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("status lacks %q:\n%s", w, text)
		}
	}
}

// TestStaleLoadSaysItsAge: a server reading older than its probe interval
// is printed with its age by status and watch; a fresh one is not.
func TestStaleLoadSaysItsAge(t *testing.T) {
	for _, c := range []struct {
		name     string
		age      time.Duration
		every    time.Duration
		wantNote string
	}{
		{"fresh", 3 * time.Second, 5 * time.Second, ""},
		{"one interval", 5 * time.Second, 5 * time.Second, ""},
		{"stale", 42 * time.Second, 5 * time.Second, "(read 42s ago)"},
		{"stale, interval unknown", 12 * time.Second, 0, "(read 12s ago)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := limitedEndpoint(128, "")
			e.Load.At, e.Load.Every, e.Load.Age = time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC), c.every, c.age
			r := monitor.Report{Job: "demo", State: monitor.Running, Endpoints: []monitor.EndpointStatus{e}}
			s := watchFixture()
			s.Report.Endpoints = r.Endpoints
			for view, text := range map[string]string{"status": StatusText("demo", r), "watch": ansi.Strip(RenderWatch(s, PaneProgress, 200, 60))} {
				has := strings.Contains(text, "ago)")
				if c.wantNote == "" && has || c.wantNote != "" && !strings.Contains(text, c.wantNote) {
					t.Errorf("%s with a reading %s old (probe every %s): want note %q in:\n%s", view, c.age, c.every, c.wantNote, text)
				}
			}
		})
	}
}
