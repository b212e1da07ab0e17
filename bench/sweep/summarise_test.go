package main

import (
	"testing"

	"github.com/regen-dev/regen/bench/internal/bound"
)

// TestSummariseLeavesOutRunnerBound: a runner-bound run does not count in
// its cell; a cell of runner-bound runs only is marked so.
func TestSummariseLeavesOutRunnerBound(t *testing.T) {
	run := func(tokens int64, class string) result {
		return result{Tokens: tokens, SimSeconds: 1, Wall: 1, Bound: class, Sim95: 1}
	}
	c := summarise([]result{run(100, bound.Server), run(40, bound.Runner), run(120, bound.Server)})
	if c.bound != bound.Server || c.runnerRuns != 1 || c.mean != 110 || c.median != 110 || c.low != 100 {
		t.Errorf("mixed cell: bound %s, %d runner runs, mean %v, median %v, low %v; want server, 1, 110, 110, 100", c.bound, c.runnerRuns, c.mean, c.median, c.low)
	}
	c = summarise([]result{run(40, bound.Runner), run(50, bound.Runner)})
	if c.bound != bound.Runner || c.runnerRuns != 2 || c.mean != 45 {
		t.Errorf("runner cell: bound %s, %d runner runs, mean %v; want runner, 2, 45", c.bound, c.runnerRuns, c.mean)
	}
	if best := bestFixed([]cell{{setting: setting{Short: 32, Long: 8}, mean: 200, bound: bound.Runner}, {setting: setting{Short: 64, Long: 16}, mean: 100, bound: bound.Limit}}); best != 1 {
		t.Errorf("bestFixed = %d; want 1 (the runner-bound cell is no result)", best)
	}
}
