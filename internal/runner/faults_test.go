package runner

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

const (
	faultSamples = 300
	hangSamples  = 200
)

// TestServerKilled kills the supervised simulator with SIGKILL mid-run: the
// endpoint goes DOWN, the server is restarted, and the job completes with
// every sample done once and no attempt spent by the outage (each done
// sample has the attempt count of a no-fault baseline run).
func TestServerKilled(t *testing.T) {
	baseline := func() int {
		spec := newJob(t, "supervised.yaml.tmpl", 50, jobParams{})
		st := openStore(t, spec)
		sum, err := startRun(t, spec, st, true).wait(t, 60*time.Second)
		if err != nil {
			t.Fatalf("baseline run: %v", err)
		}
		rows := finishedRows(t, st)
		if len(rows) == 0 {
			t.Fatalf("baseline run finished nothing: %+v", sum.Final)
		}
		for _, r := range rows[1:] {
			if r.Attempts != rows[0].Attempts {
				t.Fatalf("baseline attempts differ: %s has %d, %s has %d", rows[0].ID, rows[0].Attempts, r.ID, r.Attempts)
			}
		}
		return rows[0].Attempts
	}()

	spec := newJob(t, "supervised.yaml.tmpl", faultSamples, jobParams{})
	st := openStore(t, spec)
	r := startRun(t, spec, st, false)
	waitDone(t, r, st, faultSamples/4)
	pid := serverPID(t, st)
	killedAt := kill(t, pid, syscall.SIGKILL)

	var down store.Event
	waitFor(t, r, 30*time.Second, "DOWN event", func() bool {
		var ok bool
		down, ok = firstState(t, st, killedAt, "DOWN")
		return ok
	})
	recordLatency(t, "exit (SIGKILL to DOWN event)", down.Time.Sub(killedAt))
	if !strings.Contains(down.Evidence, "signal killed") {
		t.Errorf("DOWN evidence %q does not name the signal", down.Evidence)
	}
	sum, err := r.wait(t, 90*time.Second)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if got, want := states(endpointEvents(t, st, killedAt)), []string{"DOWN", "RESTARTING", "STARTING", "READY", "STOPPED"}; !slices.Equal(got, want) {
		t.Errorf("endpoint states after the kill: got %v, want %v", got, want)
	}
	if ready, ok := firstState(t, st, killedAt, "READY"); ok {
		t.Logf("kill to READY again: %v", ready.Time.Sub(killedAt).Round(time.Millisecond))
	}
	checkExactlyOnce(t, spec, st, sum, faultSamples, baseline)
	if sum.Final.State != monitor.Done {
		t.Errorf("final state: got %s, want DONE (%v)", sum.Final.State, sum.Final.Evidence)
	}
}

// TestServerHangs covers the three ways a server stops generating while its
// process lives: SIGSTOP, the simulator's hang fault and its zombie fault.
// Each must be STALLED once no token came for server.hang_timeout with
// requests in flight, restarted, and the job completed exactly once.
func TestServerHangs(t *testing.T) {
	const hang = time.Second
	tests := []struct {
		name string
		sim  map[string]any
		stop bool // SIGSTOP the server mid-run
	}{
		{name: "sigstop", stop: true},
		// Every launch has the fault, so it fires after more requests than
		// the second launch gets: one hang per test.
		{name: "sim hang", sim: map[string]any{"hang_after_requests": 120}},
		{name: "sim zombie", sim: map[string]any{"zombie_after_requests": 120}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := newJob(t, "supervised.yaml.tmpl", hangSamples, jobParams{Hang: hang.String(), Sim: fastSim(tt.sim)})
			st := openStore(t, spec)
			r := startRun(t, spec, st, false)
			var since time.Time
			if tt.stop {
				waitDone(t, r, st, hangSamples/4)
				since = kill(t, serverPID(t, st), syscall.SIGSTOP)
			} else {
				// The fault fires in the first launch; the last token before it is the reference.
				waitFor(t, r, 30*time.Second, "READY", func() bool { _, ok := firstState(t, st, time.Time{}, "READY"); return ok })
			}
			var stalled store.Event
			waitFor(t, r, 60*time.Second, "STALLED event", func() bool {
				var ok bool
				stalled, ok = firstState(t, st, since, "STALLED")
				return ok
			})
			t.Logf("STALLED evidence: %s", stalled.Evidence)
			if tt.stop {
				recordLatency(t, tt.name+" (SIGSTOP to STALLED event)", stalled.Time.Sub(since))
			} else if silent, ok := tokenSilence(stalled.Evidence); ok {
				recordLatency(t, tt.name+" (token silence at STALLED, hang_timeout "+hang.String()+")", silent)
			}
			sum, err := r.wait(t, 90*time.Second)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			for _, e := range endpointEvents(t, st, stalled.Time) {
				if e.State == "RESTARTING" {
					t.Logf("STALLED to RESTARTING (group killed and reaped): %v", e.Time.Sub(stalled.Time).Round(time.Millisecond))
					break
				}
			}
			got := states(endpointEvents(t, st, stalled.Time))
			if want := []string{"STALLED", "RESTARTING", "STARTING", "READY"}; len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
				t.Errorf("endpoint states from STALLED: got %v, want a prefix %v", got, want)
			}
			checkExactlyOnce(t, spec, st, sum, hangSamples, 1)
		})
	}
}

// TestCrashOnLoad runs a server that crashes with CUDA OOM whenever its KV
// cache stays full: after restart.max crashes in a row the endpoint is
// FAILED, Run returns a *FailedError naming the cause, and the store holds
// every sample pending or done with no attempt spent.
func TestCrashOnLoad(t *testing.T) {
	const n = 1000 // far more than the crashing launches can finish
	sim := fastSim(map[string]any{"kv_tokens": 4000, "crash_kv_above": 0.3, "crash_kv_for": "500ms", "crash_error": "oom"})
	spec := newJob(t, "supervised.yaml.tmpl", n, jobParams{Concurrency: 32, Sim: sim, RestartMax: 5})
	st := openStore(t, spec)
	start := time.Now()
	_, err := startRun(t, spec, st, true).wait(t, 90*time.Second)
	t.Logf("run ended after %v: %v", time.Since(start).Round(time.Millisecond), err)
	failed, ok := errorsAs[*FailedError](err)
	if !ok {
		t.Fatalf("run error: got %v (%T), want *runner.FailedError", err, err)
	}
	if !strings.Contains(failed.Cause, "cuda_oom") {
		t.Errorf("FailedError cause %q does not name cuda_oom", failed.Cause)
	}
	if len(failed.Evidence) == 0 || !strings.Contains(failed.Evidence[0], "5 failures within") {
		t.Errorf("FailedError evidence %q does not start with the failure count", failed.Evidence)
	}
	evs := endpointEvents(t, st, time.Time{})
	downs, restarts := 0, 0
	for _, e := range evs {
		switch e.State {
		case "DOWN":
			downs++
			if !strings.Contains(e.Evidence, "cuda_oom") && !strings.Contains(e.Evidence, "out of memory") {
				t.Errorf("DOWN evidence %q names no OOM", e.Evidence)
			}
		case "RESTARTING":
			restarts++
		}
	}
	var gaps []string // RESTARTING to the next STARTING: the backoff actually waited
	for i, e := range evs {
		if e.State == "RESTARTING" && i+1 < len(evs) && evs[i+1].State == "STARTING" {
			gaps = append(gaps, evs[i+1].Time.Sub(e.Time).Round(time.Millisecond).String())
		}
	}
	t.Logf("restart delays (backoff 100ms, doubled): %v", gaps)
	if downs != 5 || restarts != 4 {
		t.Errorf("got %d DOWN and %d RESTARTING events, want 5 and 4: %v", downs, restarts, states(evs))
	}
	if last := evs[len(evs)-1]; last.State != "FAILED" {
		t.Errorf("last endpoint state: got %s, want FAILED", last.State)
	}
	for _, s := range []store.State{store.Leased, store.Dead, store.Rejected} {
		if got := countState(t, st, s); got != 0 {
			t.Errorf("%s samples: got %d, want 0", s, got)
		}
	}
	if got := countState(t, st, store.Pending) + countState(t, st, store.Done); got != n {
		t.Errorf("pending+done: got %d, want %d", got, n)
	}
	for _, r := range finishedRows(t, st) {
		if r.Attempts != 1 {
			t.Errorf("done sample %s: %d attempts, want 1 (%s)", r.ID, r.Attempts, spentOn(t, st, r.ID))
		}
	}
	rep, err := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != monitor.Failed || rep.ExitCode != 2 {
		t.Errorf("status: got %s exit %d (%v), want FAILED exit 2", rep.State, rep.ExitCode, rep.Evidence)
	}
	t.Logf("status evidence: %v", rep.Evidence)
}

// tokenSilence reads "no token for 1.2s" from a STALLED event's evidence.
func tokenSilence(ev string) (time.Duration, bool) {
	_, rest, ok := strings.Cut(ev, "no token for ")
	if !ok {
		return 0, false
	}
	f, _, _ := strings.Cut(rest, " ")
	d, err := time.ParseDuration(f)
	return d, err == nil
}

// TestInProcessSim runs the same faults against the in-process simulator
// (engine sim without a command), whose fleet restarts it itself: a crash is
// DOWN and a hang or zombie is STALLED, each followed by a restart and a
// job completed exactly once with no attempt spent by the outage.
func TestInProcessSim(t *testing.T) {
	tests := []struct {
		name     string
		sim      map[string]any
		state    string
		restarts int // the restart budget; 0 = newJob's
	}{
		{name: "crash", sim: map[string]any{"crash_after_requests": 120}, state: "DOWN"},
		// Every life streams 5,000 tokens and the job needs about 22,700
		// plus what each crash cuts off in flight: five lives suffice or
		// not by a few hundred tokens, depending on timing. The budget
		// leaves room, so the test checks the recovery, not the luck.
		{name: "crash mid-stream", sim: map[string]any{"crash_after_tokens": 5000, "crash_error": "abrupt"}, state: "DOWN", restarts: 10},
		{name: "hang", sim: map[string]any{"hang_after_requests": 120}, state: "STALLED"},
		{name: "zombie", sim: map[string]any{"zombie_after_requests": 120}, state: "STALLED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := newJob(t, "inprocess.yaml.tmpl", hangSamples, jobParams{Concurrency: 8, Hang: "1s", Sim: fastSim(tt.sim), RestartMax: tt.restarts})
			st := openStore(t, spec)
			sum, err := startRun(t, spec, st, false).wait(t, 60*time.Second)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			evs := endpointEvents(t, st, time.Time{})
			var from []string
			for i, e := range evs {
				if e.State == tt.state {
					from = states(evs[i:])
					t.Logf("%s evidence: %s", e.State, e.Evidence)
					if silent, ok := tokenSilence(e.Evidence); ok {
						recordLatency(t, "in-process "+tt.name+" (token silence at STALLED, hang_timeout 1s)", silent)
					}
					break
				}
			}
			if want := []string{tt.state, "RESTARTING", "STARTING", "READY"}; len(from) < len(want) || !slices.Equal(from[:len(want)], want) {
				t.Errorf("endpoint states: got %v, want %v after the fault", states(evs), want)
			}
			checkExactlyOnce(t, spec, st, sum, hangSamples, 1)
		})
	}
}
