package runner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestAutoCrashLowersCeiling runs an auto lane against a supervised
// simulator whose small KV pool crashes it with a CUDA out-of-memory
// traceback once usage stays at or above 0.9 for 2 s: the level the
// dispatcher calls pressure (crashKV), held for less time than the pool
// takes to grow from there to the 0.97 that sheds, so shedding does not
// prevent it. (At 0.8 for 8 s the crash could come while the last probes
// read 0.8-0.9, not pressure by the rule: 1 in 18 runs under load, and
// once in CI, crashed without a ceiling.) The lane
// starts at 48, far above the 9 requests that fill the pool, so the first
// crash comes under pressure: the log's signature after high KV at the
// probes lowers the lane's ceiling below the load that crashed, the event
// says so, and the controller learns the level (it backs off 0.05 below
// the KV usage it crashed at, after each crash). The job still finishes
// every sample exactly once, and status shows the limit and why it moved.
// Speed 10 leaves a runner slowed by the race detector time to probe the
// pressure before each crash, and the restart budget room for a few.
func TestAutoCrashLowersCeiling(t *testing.T) {
	const n = 60
	sim := fastSim(map[string]any{"speed": 10, "kv_tokens": 20000, "output_mean": 2000, "output_sigma": 0.3,
		"crash_kv_above": 0.9, "crash_kv_for": "2s", "crash_error": "oom"})
	spec := newJob(t, "auto.yaml.tmpl", n, jobParams{Concurrency: 48, Hang: "5s", RestartMax: 20, Sim: sim})
	st := openStore(t, spec)
	sum, err := startRun(t, spec, st, false).wait(t, 180*time.Second)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	checkExactlyOnce(t, spec, st, sum, n, 1)

	evs, err := st.Events(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var downs, ceilings int
	for _, e := range evs {
		switch {
		case e.Kind == "endpoint_state" && e.State == "DOWN":
			downs++
			if !strings.HasPrefix(e.Evidence, "cuda_oom") {
				t.Errorf("DOWN evidence %q: want the log's cuda_oom first", e.Evidence)
			}
		case e.Kind == "endpoint_limit" && strings.Contains(e.Evidence, "lane default: shed"):
			t.Logf("event: %s", e.Evidence)
			if !strings.Contains(e.Evidence, "KV usage") || !strings.Contains(e.Evidence, "released without spending an attempt") {
				t.Errorf("shed evidence %q: want the KV usage and what was cancelled", e.Evidence)
			}
		case e.Kind == "endpoint_limit":
			ceilings++
			t.Logf("event: %s", e.Evidence)
			if !strings.Contains(e.Evidence, "lane default: ceiling") || !strings.Contains(e.Evidence, "under pressure (cuda_oom with KV usage") {
				t.Errorf("endpoint_limit evidence %q: want the ceiling and the KV usage before the crash", e.Evidence)
			}
		}
	}
	if downs == 0 {
		t.Fatalf("the simulator never crashed; the test's fault is too mild")
	}
	// A crash right after a restart, before the probes saw KV usage high,
	// is not one under pressure: no ceiling for it.
	if ceilings == 0 || ceilings > downs {
		t.Errorf("%d crashes and %d ceiling events: want one for each crash under pressure, at least one", downs, ceilings)
	}

	rep, err := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Endpoints) != 1 {
		t.Fatalf("endpoints in status: %+v", rep.Endpoints)
	}
	e := rep.Endpoints[0]
	t.Logf("status: limit %d (%s), kv_tokens %d, lanes %+v", e.Limit, e.LimitReason, e.KVTokens, e.Lanes)
	if e.Limit < 1 || e.LimitReason == "" || e.KVTokens != 20000 || e.KVTokensSource != "server" || e.Load == nil || e.Load.KVUsage == nil {
		t.Errorf("status endpoint: limit %d, reason %q, pool %d from %q, load %+v: want them all filled", e.Limit, e.LimitReason, e.KVTokens, e.KVTokensSource, e.Load)
	}
	if len(e.Lanes) != 1 || !e.Lanes[0].Auto || e.Lanes[0].Ceiling < 1 || e.Lanes[0].Limit > e.Lanes[0].Ceiling {
		t.Errorf("status lanes %+v: want an auto lane under a crash ceiling", e.Lanes)
	}
}
