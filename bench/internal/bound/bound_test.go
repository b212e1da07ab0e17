package bound

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		l    Load
		u    Usage
		want string
	}{
		{"queues most of the bulk", Load{Busy: 0.8, Samples: 10}, Usage{CPUShare: 0.3, SpeedShare: 0.95}, Server},
		{"saturated exactly half", Load{Busy: 0.5, Samples: 10}, Usage{CPUShare: 0.3, SpeedShare: 1}, Server},
		// The loaded mt4 (simulators at 7-11x of 25x): queues
		// full, but the probes and clients ran at another pace.
		{"queues full, slow clock", Load{Busy: 0.96, Samples: 10}, Usage{CPUShare: 0.16, SpeedShare: 0.34}, Runner},
		{"queues full, cores full", Load{Busy: 0.96, Samples: 10}, Usage{CPUShare: 0.85, SpeedShare: 0.95}, Runner},
		// The loaded mt4: KV 0.27-0.45, empty queues, 2 cores busy.
		{"idle servers, busy cores", Load{Busy: 0.1, KV: 0.35, Samples: 10}, Usage{CPUShare: 0.9, SpeedShare: 0.95}, Runner},
		{"idle servers, slow clock", Load{Busy: 0.1, Samples: 10}, Usage{CPUShare: 0.5, SpeedShare: 0.4}, Runner},
		{"idle servers, spare CPU", Load{Busy: 0.2, Samples: 10}, Usage{CPUShare: 0.5, SpeedShare: 0.97}, Limit},
		{"no samples", Load{Busy: 1}, Usage{CPUShare: 0.5, SpeedShare: 1}, Limit},
	}
	for _, tc := range tests {
		if got := Classify(tc.l, tc.u); got != tc.want {
			t.Errorf("%s: Classify(%+v, %+v) = %s, want %s", tc.name, tc.l, tc.u, got, tc.want)
		}
	}
}

// TestBulkLoad: a server is saturated at a scrape with a queue, a KV
// pool 90% full or (slot-bound) every slot busy, and the mean stops at the
// bulk's end.
func TestBulkLoad(t *testing.T) {
	samples := []Sample{
		NewSample(1, []Gauges{{Queue: 3, Usage: 0.5, Running: 10}, {Usage: 0.95, Running: 20}}),
		NewSample(2, []Gauges{{Usage: 0.5, Running: 10}, {Usage: 0.4, Running: 20}}),
		NewSample(3, []Gauges{{Queue: 9}, {Queue: 9}}), // the tail, after the bulk
	}
	l := MeanLoad(samples, 2.5)
	if l.Samples != 2 || l.Busy != 0.5 || l.Queue != 1.5 || l.InFlight != 31.5 {
		t.Errorf("MeanLoad = %+v; want 2 samples, busy 0.5, queue 1.5, in flight 31.5", l)
	}
	slots := NewSample(0, []Gauges{{Running: 8, Slots: 8}, {Running: 7, Slots: 8}, {Running: 8}})
	if slots.Busy != 1.0/3 {
		t.Errorf("slot-bound servers: busy %v; want 1/3 (8 of 8 slots busy; 7 of 8 is not, nor 8 with no slot limit)", slots.Busy)
	}
}

// TestWithheld: a ratio stands between limit- and server-bound cells and
// is withheld, with the runner-bound side's evidence, otherwise.
func TestWithheld(t *testing.T) {
	cell := func(cpu, speed float64) Cell {
		c := Cell{Load: Load{Busy: 0.9, Samples: 5}, Usage: Usage{CPUShare: cpu, SpeedShare: speed}, Cores: 2, Servers: 1, Paced: true}
		c.Class = Classify(c.Load, c.Usage)
		return c
	}
	server, busyCores, slowClock := cell(0.4, 1), cell(0.95, 1), cell(0.3, 0.62)
	tests := []struct {
		name string
		a, b Cell
		want string
	}{
		{"both server-bound", server, server, ""},
		{"reference short of CPU", server, busyCores, "runner-bound: reference CPU 1.9 of 2 cores"},
		{"regen's clock slow", slowClock, server, "runner-bound: regen sim speed 62% of asked"},
		{"both", busyCores, slowClock, "runner-bound: regen CPU 1.9 of 2 cores; reference sim speed 62% of asked"},
	}
	for _, tc := range tests {
		if got := Withheld(Side{"regen", tc.a}, Side{"reference", tc.b}); got != tc.want {
			t.Errorf("%s: Withheld = %q; want %q", tc.name, got, tc.want)
		}
	}
	if got, want := server.Evidence(), "server (saturated 90%, KV 0.00, queue 0.0, in flight 0; CPU 0.80 of 2 cores, sim speed 100%)"; got != want {
		t.Errorf("Evidence = %q; want %q", got, want)
	}
}

// TestMerge: rounds of one side are classified on their mean usage.
func TestMerge(t *testing.T) {
	a := NewCell(Load{Busy: 0.2, Samples: 4}, Usage{CPUShare: 0.9, SpeedShare: 1}, 1, true)
	b := NewCell(Load{Busy: 0.4, Samples: 6}, Usage{CPUShare: 0.5, SpeedShare: 1}, 1, true)
	m := Merge(a, b)
	if a.Class != Runner || m.Class != Limit || m.Load.Samples != 10 || !near(m.Usage.CPUShare, 0.7) || !near(m.Load.Busy, 0.3) {
		t.Errorf("Merge = %+v; want limit over 10 samples, CPU 0.7, busy 0.3 (from runner %+v and %+v)", m, a, b)
	}
}

// TestWatchReadsServers: a Watch reads each engine's gauges and the
// simulator's clock from /metrics, and a server with none or that does not
// answer reads as idle. Its first sample is taken before StartWatch
// returns, so the test waits for no tick.
func TestWatchReadsServers(t *testing.T) {
	metrics := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	sglang := metrics("# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 4\n# TYPE sglang:token_usage gauge\nsglang:token_usage 0.5\n# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 30\n# TYPE regen_sim_clock_seconds gauge\nregen_sim_clock_seconds 12\n")
	llama := metrics("# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 8\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()

	w := StartWatch(context.Background(), WatchConfig{URLs: []string{sglang, llama, down.URL}, Speed: 10, Slots: 8})
	c := w.Stop()
	// The first sample: sglang queued, llama.cpp with 8 of 8 slots busy, the third down.
	if c.Load.Samples == 0 || c.Servers != 2 || !c.Paced {
		t.Fatalf("cell %+v; want samples, 2 servers answering, paced (a simulator clock)", c)
	}
	if !near(c.Load.Busy, 2.0/3) || c.Load.Queue != 4 || c.Load.InFlight != 42 || !near(c.Load.KV, 0.5/3) {
		t.Errorf("load %+v; want busy 2/3, queue 4, in flight 42, KV 0.5/3 on every sample", c.Load)
	}
	// A clock that stood still over a span is 0% of the asked speed; a
	// span too short to count leaves the speed unjudged.
	if c.Usage.SpeedShare != 1 && c.Usage.SpeedShare != 0 {
		t.Errorf("speed share %v of a clock that never moved; want 0 (or 1 when no span was counted)", c.Usage.SpeedShare)
	}

	plain := StartWatch(context.Background(), WatchConfig{}).Stop()
	if plain.Servers != 0 || plain.Paced || plain.Load.Samples != 0 || !strings.Contains(plain.Evidence(), "no server metrics") {
		t.Errorf("a plain server's cell %+v (%s); want no servers, not paced, no samples", plain, plain.Evidence())
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
