package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

func TestProgressPlainLinesAndETA(t *testing.T) {
	var b strings.Builder
	p := NewProgress(&b, false)
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cell := func(done, pending, inflight, dead int) []monitor.CellCounts {
		return []monitor.CellCounts{{Partition: "B1", Lane: "short", Total: done + pending + inflight + dead, Done: done, Pending: pending, InFlight: inflight, Dead: dead}}
	}
	p.Update(monitor.Frame{Time: t0, Job: "demo", State: monitor.Running, Cells: cell(0, 100, 0, 0)})
	p.Update(monitor.Frame{Time: t0.Add(10 * time.Second), Job: "demo", State: monitor.Running, Cells: cell(50, 48, 2, 0), Tokens: 5000, InFlight: 2})
	p.Update(monitor.Frame{Time: t0.Add(20 * time.Second), Job: "demo", State: monitor.Running, Cells: cell(99, 0, 1, 0), Tokens: 9000, InFlight: 1})
	p.Update(monitor.Frame{Time: t0.Add(30 * time.Second), Job: "demo", State: monitor.Stalled, Evidence: []string{"no token for 31s"}, Cells: cell(99, 0, 0, 1), Tokens: 9000})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []string{
		"12:00:00 demo RUNNING elapsed=0s in_flight=0 tok/s=0 | B1 0/100",
		"12:00:10 demo RUNNING elapsed=10s in_flight=2 tok/s=500 | B1 50/100 eta=10s",
		"12:00:20 demo RUNNING elapsed=20s in_flight=1 tok/s=470 | B1 99/100 eta=<1s",
		"12:00:30 demo STALLED elapsed=30s in_flight=0 tok/s=0 | B1 99/100 dead=1 eta=done | no token for 31s",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), b.String())
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i, lines[i], want[i])
		}
	}
}

// TestProgressETAInFlightTail: at 583/600 with 17 long requests in flight
// the throughput alone says "<1s"; the long lane's in-flight tail is 8s.
func TestProgressETAInFlightTail(t *testing.T) {
	var b strings.Builder
	p := NewProgress(&b, false)
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cells := func(done, pending, inflight int) []monitor.CellCounts {
		return []monitor.CellCounts{
			{Partition: "B2", Lane: "short", Total: 300, Done: 300},
			{Partition: "B2", Lane: "long", Total: 300, Done: done - 300, Pending: pending, InFlight: inflight},
		}
	}
	lanes := []monitor.LaneTiming{{Name: "short", MeanDuration: time.Second},
		{Name: "long", MeanDuration: 9 * time.Second, Tail: 8 * time.Second}}
	p.Update(monitor.Frame{Time: t0, Job: "demo", State: monitor.Running, Cells: cells(300, 283, 17), Lanes: lanes})
	p.Update(monitor.Frame{Time: t0.Add(10 * time.Second), Job: "demo", State: monitor.Running, Cells: cells(583, 0, 17), Lanes: lanes, InFlight: 17})
	p.Update(monitor.Frame{Time: t0.Add(11 * time.Second), Job: "demo", State: monitor.Down, Cells: cells(590, 0, 10), Lanes: lanes, InFlight: 10})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if want := "| B2 583/600 eta=8s"; !strings.HasSuffix(lines[1], want) {
		t.Errorf("with 17 long requests in flight:\n got %q\nwant it to end in %q", lines[1], want)
	}
	if strings.Contains(lines[2], "eta=") || !strings.Contains(lines[2], "tok/s=0") {
		t.Errorf("while DOWN there is no ETA and no throughput: %q", lines[2])
	}

	// Queued work: the queue drains at the finish rate, then the last
	// request needs the lane's mean duration.
	var b2 strings.Builder
	p = NewProgress(&b2, false)
	p.Update(monitor.Frame{Time: t0, Job: "demo", State: monitor.Running, Cells: cells(300, 300, 0), Lanes: lanes})
	p.Update(monitor.Frame{Time: t0.Add(10 * time.Second), Job: "demo", State: monitor.Running, Cells: cells(400, 180, 20), Lanes: lanes})
	if want := "| B2 400/600 eta=27s"; !strings.HasSuffix(strings.TrimSpace(b2.String()), want) { // 180 at 10/s + 9s
		t.Errorf("with 180 queued:\n got %q\nwant it to end in %q", b2.String(), want)
	}
}

// TestProgressETAEscalationTail: B1 at 289/300 with 11 short requests in
// flight, each a second from its answer. The short lane's answers escalate
// to the long lane (mean 10s) 13% of the time, so the partition's last
// answers are likely to need a long request more: the ETA says so instead
// of "<1s". With no escalation observed, the in-flight tail alone.
func TestProgressETAEscalationTail(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cells := func(done, inflight int) []monitor.CellCounts {
		return []monitor.CellCounts{{Partition: "B1_glaive", Lane: "short", Total: 300, Done: done, InFlight: inflight, Pending: 300 - done - inflight}}
	}
	for _, tc := range []struct {
		name                string
		answered, escalated int64
		onWire              int           // short requests on the wire (11 samples leased in short)
		longTail            time.Duration // the long lane's in-flight tail
		want                string
		kept                int // short samples claimed ahead, held for their endpoint
	}{
		{"13% escalate", 300, 40, 11, 0, "eta=9s", 0}, // 1s + (1 - 0.867^11) x 10s
		{"none escalate", 300, 0, 11, 0, "eta=1s", 0},
		{"no answer yet", 0, 0, 11, 0, "eta=1s", 0},
		// The demo's tail: the last 11 were truncated and re-sent to the
		// long lane under their leases; the store still counts them short.
		{"being answered in the long lane", 327, 0, 0, 12 * time.Second, "eta=12s", 0},
		// Leased but not on the wire because the dispatcher holds them for
		// the endpoint that caches their prefix, not because they escalated.
		{"kept for their endpoint", 327, 0, 5, 12 * time.Second, "eta=1s", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			p := NewProgress(&b, false)
			lanes := []monitor.LaneTiming{
				{Name: "short", MeanDuration: 2 * time.Second, Tail: time.Second, EscalateTo: "long", Answered: tc.answered, Escalated: tc.escalated, InFlight: tc.onWire, Kept: tc.kept},
				{Name: "long", MeanDuration: 10 * time.Second, Tail: tc.longTail},
			}
			p.Update(monitor.Frame{Time: t0, Job: "demo", State: monitor.Running, Cells: cells(200, 20), Lanes: lanes})
			p.Update(monitor.Frame{Time: t0.Add(10 * time.Second), Job: "demo", State: monitor.Running, Cells: cells(289, 11), Lanes: lanes, InFlight: 11})
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			if got := lines[len(lines)-1]; !strings.HasSuffix(got, "| B1_glaive 289/300 "+tc.want) {
				t.Errorf("got %q, want it to end in %q", got, "B1_glaive 289/300 "+tc.want)
			}
		})
	}
}
