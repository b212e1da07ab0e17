package main

import "testing"

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		l    load
		u    usage
		want string
	}{
		{"queues most of the bulk", load{busy: 0.8, samples: 10}, usage{cpuShare: 0.95, speedShare: 0.4}, boundServer},
		{"saturated exactly half", load{busy: 0.5, samples: 10}, usage{cpuShare: 0.3, speedShare: 1}, boundServer},
		// The loaded mt4: KV 0.27-0.45, empty queues, 2 cores busy.
		{"idle servers, busy cores", load{busy: 0.1, kv: 0.35, samples: 10}, usage{cpuShare: 0.9, speedShare: 0.95}, boundRunner},
		{"idle servers, slow clock", load{busy: 0.1, samples: 10}, usage{cpuShare: 0.5, speedShare: 0.4}, boundRunner},
		{"idle servers, spare CPU", load{busy: 0.2, samples: 10}, usage{cpuShare: 0.5, speedShare: 0.97}, boundLimit},
		{"no samples", load{busy: 1}, usage{cpuShare: 0.5, speedShare: 1}, boundLimit},
	}
	for _, tc := range tests {
		if got := classify(tc.l, tc.u); got != tc.want {
			t.Errorf("%s: classify(%+v, %+v) = %s, want %s", tc.name, tc.l, tc.u, got, tc.want)
		}
	}
}

// TestBulkLoad: a server is saturated at a scrape with a queue or a KV
// pool 90% full, and the mean stops at the bulk's end.
func TestBulkLoad(t *testing.T) {
	samples := []loadSample{
		newLoadSample(1, []gauges{{queue: 3, usage: 0.5, running: 10}, {usage: 0.95, running: 20}}),
		newLoadSample(2, []gauges{{usage: 0.5, running: 10}, {usage: 0.4, running: 20}}),
		newLoadSample(3, []gauges{{queue: 9}, {queue: 9}}), // the tail, after the bulk
	}
	l := meanLoad(samples, 2.5)
	if l.samples != 2 || l.busy != 0.5 || l.queue != 1.5 || l.inFlight != 31.5 {
		t.Errorf("meanLoad = %+v; want 2 samples, busy 0.5, queue 1.5, in flight 31.5", l)
	}
}

// TestSummariseLeavesOutRunnerBound: a runner-bound run does not count in
// its cell; a cell of runner-bound runs only is marked so.
func TestSummariseLeavesOutRunnerBound(t *testing.T) {
	run := func(tokens int64, bound string) result {
		return result{Tokens: tokens, SimSeconds: 1, Wall: 1, Bound: bound, Sim95: 1}
	}
	c := summarise([]result{run(100, boundServer), run(40, boundRunner), run(120, boundServer)})
	if c.bound != boundServer || c.runnerRuns != 1 || c.mean != 110 || c.median != 110 || c.low != 100 {
		t.Errorf("mixed cell: bound %s, %d runner runs, mean %v, median %v, low %v; want server, 1, 110, 110, 100", c.bound, c.runnerRuns, c.mean, c.median, c.low)
	}
	c = summarise([]result{run(40, boundRunner), run(50, boundRunner)})
	if c.bound != boundRunner || c.runnerRuns != 2 || c.mean != 45 {
		t.Errorf("runner cell: bound %s, %d runner runs, mean %v; want runner, 2, 45", c.bound, c.runnerRuns, c.mean)
	}
	if best := bestFixed([]cell{{setting: setting{Short: 32, Long: 8}, mean: 200, bound: boundRunner}, {setting: setting{Short: 64, Long: 16}, mean: 100, bound: boundLimit}}); best != 1 {
		t.Errorf("bestFixed = %d; want 1 (the runner-bound cell is no result)", best)
	}
}
