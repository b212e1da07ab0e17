package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/regen-dev/regen/bench/internal/bound"
)

// TestRenderTableWithholdsRunnerBoundRatios: a row whose sides were
// limit- or server-bound prints its ratio; one with a runner-bound side
// prints why it has none instead; a row of regen's own code prints its
// ratio and says so.
func TestRenderTableWithholdsRunnerBoundRatios(t *testing.T) {
	cell := func(busy, cpu, speed float64) bound.Cell {
		return bound.NewCell(bound.Load{Busy: busy, Samples: 20}, bound.Usage{CPUShare: cpu, SpeedShare: speed}, 1, true)
	}
	limit, server, starved := cell(0.1, 0.4, 1), cell(0.8, 0.5, 0.97), cell(0.1, 0.95, 1)
	rows := []row{
		{name: "e2e samples", unit: "samples/s", better: "higher", regen: 771, ref: 986, note: "plain loops", sides: sides(limit, server)},
		{name: "e2e tokens", unit: "tokens/s", better: "higher", regen: 92200, ref: 118000, note: "plain loops", sides: sides(limit, starved)},
		{name: "store commits", unit: "completions/s", better: "higher", regen: 4458, ref: 12600, note: "raw INSERT"},
	}
	lines := renderTable(rows)
	if len(lines) != 4 || !strings.Contains(lines[0], "bound (regen / ref)") {
		t.Fatalf("table %q; want a header with the bound column and 3 rows", lines)
	}
	cores := starved.Cores
	for _, tc := range []struct {
		line      string
		want, not []string
	}{
		{lines[1], []string{"0.78x", "limit / server"}, []string{"runner-bound"}},
		{lines[2], []string{fmt.Sprintf("runner-bound: reference CPU %.1f of %d cores", 0.95*float64(cores), cores), "limit / runner"}, []string{"0.78x"}},
		{lines[3], []string{"0.35x", ownCode}, []string{"runner-bound"}},
	} {
		for _, w := range tc.want {
			if !strings.Contains(tc.line, w) {
				t.Errorf("row %q lacks %q", tc.line, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(tc.line, n) {
				t.Errorf("row %q has %q", tc.line, n)
			}
		}
	}
}
