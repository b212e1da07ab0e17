package main

import (
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
)

// TestRenderWithholdsRunnerBoundRatios: a cell's ratios against the fixed
// cell are printed when neither was runner-bound, and replaced by the
// reason otherwise; every cell's evidence follows the table.
func TestRenderWithholdsRunnerBoundRatios(t *testing.T) {
	classified := func(busy, cpu, speed float64) bound.Cell {
		return bound.NewCell(bound.Load{Busy: busy, Samples: 40}, bound.Usage{CPUShare: cpu, SpeedShare: speed}, 1, true)
	}
	m := func(ttft time.Duration, tokens int, c bound.Cell) measure {
		return measure{engine: "llamacpp", pool: 16384, peak: 8, ttft50: ttft, ttft99: 2 * ttft, tokens: tokens, samples: 200, wall: 10 * time.Second, bound: c}
	}
	cells := []cell{{"fixed 8", "8", ""}, {"auto, detected", "auto", ""}, {"auto, taken for sglang", "auto", "sglang"}}
	out := []measure{m(100*time.Millisecond, 60000, classified(0.9, 0.4, 1)), m(110*time.Millisecond, 57000, classified(0.8, 0.5, 0.98)), m(900*time.Millisecond, 58000, classified(0.9, 0.3, 0.55))}
	lines := render(cells, out, 20)
	rows := map[string]string{}
	for _, l := range lines {
		for _, c := range cells {
			if strings.HasPrefix(l, c.name+" ") {
				rows[c.name] = l
			}
		}
	}
	if r := rows["auto, detected"]; !strings.Contains(r, "1.10") || !strings.Contains(r, "0.95") || !strings.Contains(r, "server") {
		t.Errorf("server-bound row %q; want TTFT 1.10 and goodput 0.95 x fixed", r)
	}
	if r := rows["auto, taken for sglang"]; strings.Contains(r, "9.00") || strings.Contains(r, "0.97") ||
		!strings.Contains(r, "runner-bound: auto, taken for sglang sim speed 55% of asked") {
		t.Errorf("runner-bound row %q; want its ratios (9.00, 0.97) withheld with the reason", r)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "auto, taken for sglang: bound runner (saturated 90%") {
		t.Errorf("no evidence line for the runner-bound cell in %q", lines)
	}
}
