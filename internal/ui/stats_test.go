package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/store"
)

func TestStatsText(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cell := stats.Cell{Partition: "B1_glaive", Lane: "short", Samples: stats.Samples{Total: 300, Done: 290, Rejected: 10}, Answers: 352,
		PromptTokens:     stats.Percentiles{P50: 120, P90: 400, P99: 900, Max: 1200, Sum: 1},
		CompletionTokens: stats.Percentiles{P50: 300, P90: 2000, P99: 9000, Max: 10240, Sum: 1},
		TruncationRate:   0.0284, RejectRate: 0.0284, EndedEarly: 40, ReasoningShare: 0.3}
	r := stats.Report{Job: "demo", Cells: []stats.Cell{cell}, Total: cell, BadRows: 3,
		Rejects:       []stats.RuleCount{{Rule: "truncated", N: 10}},
		Duplicates:    stats.Duplicates{Total: 1, SameContent: 1, Examples: []store.Duplicate{{ID: "p/x", Origin: "f:9", FirstOrigin: "f:2", SameContent: true}}},
		Throughput:    []stats.Point{{Start: t0, CompletionPerSec: 100}, {Start: t0.Add(time.Minute)}, {Start: t0.Add(2 * time.Minute), CompletionPerSec: 50}},
		BucketSeconds: 60}
	got := StatsText(r)
	for _, want := range []string{
		"job demo: 300 samples (290 done, 10 rejected, 0 dead, 0 pending, 0 in flight), 352 answers stored",
		"bad source rows: 3; duplicate ids at ingest: 1 (1 with the same content)",
		"B1_glaive          short         300      352 120/400/900/1200           300/2000/9000/10240           2.8%    2.8%     40     30.0%",
		"rejected by rule: truncated 10",
		"duplicate id p/x at f:9 (first at f:2, same content)",
		"completion tokens/s, 1m0s buckets, 12-01 10:00 to 12-01 10:03 (peak 100):\n  █ ▄",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("stats text lacks %q:\n%s", want, got)
		}
	}
	// A job of seconds is drawn second by second, its times to the second.
	r.Throughput = []stats.Point{{Start: t0, CompletionPerSec: 80}, {Start: t0.Add(time.Second), CompletionPerSec: 40}, {Start: t0.Add(2 * time.Second), CompletionPerSec: 80}}
	r.BucketSeconds = 1
	if got, want := StatsText(r), "completion tokens/s, 1s buckets, 12-01 10:00:00 to 12-01 10:00:03 (peak 80):\n  █▄█"; !strings.Contains(got, want) {
		t.Errorf("stats text lacks %q:\n%s", want, got)
	}
}
