package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/crew"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// A runner that is alive on this host owns the job even when its heartbeat
// is stale (stopped, or busy draining): it holds the runner lock, and a
// second runner must refuse rather than release its leases. Once that
// process is gone, takeover is immediate.
func TestTakeoverRefusesLiveRunnerWithStaleHeartbeat(t *testing.T) {
	spec := newJob(t, "inprocess.yaml.tmpl", 10, jobParams{})
	st := openStore(t, spec)
	other := exec.Command("sleep", "60")
	other.Args[0] = "regen-stand-in" // the process table is what proves a live regen
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	// The stand-in's lock: flock belongs to an open file, so one taken
	// here conflicts with the runner's as another process's would.
	unlock, ok, err := st.TryLock(context.Background(), crew.RunnerLock)
	if err != nil || !ok {
		t.Fatalf("take the runner lock: %v %v", ok, err)
	}
	host, _ := os.Hostname()
	beat, _ := json.Marshal(monitor.Beat{State: monitor.Running})
	stale := time.Now().Add(-time.Hour)
	if err := st.PutHeartbeat(context.Background(), store.Heartbeat{Owner: "other", PID: other.Process.Pid, Host: host, Time: stale, Counters: beat}); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Options{Spec: spec, Store: st, NoExport: true})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("is being run by pid %d", other.Process.Pid)) {
		t.Fatalf("Run beside a live runner = %v, want a refusal naming pid %d", err, other.Process.Pid)
	}

	other.Process.Kill()
	other.Wait()
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	sum, err := Run(context.Background(), Options{Spec: spec, Store: st, NoExport: true})
	if err != nil {
		t.Fatalf("Run after the other runner died: %v", err)
	}
	if sum.Final.Total.Done != 10 {
		t.Errorf("done = %d, want 10", sum.Final.Total.Done)
	}
}

// A holder of the runner lock that has written no heartbeat yet (the
// previous one names a gone process) is refused all the same. A heartbeat
// whose pid is a live regen-looking process, with no one holding the
// runner lock, is a dead runner's (its pid reused): the next run takes over.
func TestTakeoverByRunnerLock(t *testing.T) {
	spec := newJob(t, "inprocess.yaml.tmpl", 10, jobParams{})
	st := openStore(t, spec)
	host, _ := os.Hostname()
	beat, _ := json.Marshal(monitor.Beat{State: monitor.Running})
	putBeat := func(pid int) {
		t.Helper()
		if err := st.PutHeartbeat(context.Background(), store.Heartbeat{Owner: "previous", PID: pid, Host: host, Time: time.Now(), Counters: beat}); err != nil {
			t.Fatal(err)
		}
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	putBeat(gone.Process.Pid)
	unlock, ok, err := st.TryLock(context.Background(), crew.RunnerLock)
	if err != nil || !ok {
		t.Fatalf("take the runner lock: %v %v", ok, err)
	}
	_, err = Run(context.Background(), Options{Spec: spec, Store: st, NoExport: true})
	if err == nil || !strings.Contains(err.Error(), "holds the job's runner lock") {
		t.Fatalf("Run beside a lock holder without a heartbeat = %v, want a refusal naming the lock", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}

	reused := exec.Command("sleep", "60")
	reused.Args[0] = "regen-stand-in"
	if err := reused.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { reused.Process.Kill(); reused.Wait() }()
	putBeat(reused.Process.Pid)
	sum, err := Run(context.Background(), Options{Spec: spec, Store: st, NoExport: true})
	if err != nil {
		t.Fatalf("Run with a reused pid in the last heartbeat: %v", err)
	}
	if sum.Final.Total.Done != 10 {
		t.Errorf("done = %d, want 10", sum.Final.Total.Done)
	}
}

// A long ingest and a drain after Ctrl-C both outlast dead_after; the
// heartbeat must keep going through them so status never calls a working
// runner DEAD.
func TestHeartbeatThroughIngestAndDrain(t *testing.T) {
	spec := newJob(t, "inprocess.yaml.tmpl", 10, jobParams{Sim: fastSim(map[string]any{"speed": 1, "output_mean": 2000})})
	writePrompts(t, filepath.Join(spec.Dir, "prompts.jsonl"), 100_000)
	spec.Monitor.HeartbeatEvery = 100 * time.Millisecond
	spec.Monitor.DeadAfter = time.Second
	st := openStore(t, spec)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Options{Spec: spec, Store: st, NoExport: true, DrainTimeout: 3 * time.Second, ProgressEvery: time.Hour})
		done <- err
	}()
	// Assess as `regen status` would on another host, so only the heartbeat's age counts.
	var seen []monitor.State
	sawIngest, cancelled := false, false
	for {
		select {
		case err := <-done:
			if !cancelled {
				t.Fatalf("run ended before it was interrupted: %v", err)
			}
			if !sawIngest {
				t.Error("never observed the runner during ingest")
			}
			for _, s := range seen {
				if s == monitor.Dead {
					t.Fatalf("status said DEAD while the runner was alive: %v", seen)
				}
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
		r, err := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: spec.Monitor.DeadAfter, Host: "another-host"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Heartbeat == nil {
			// Run has not written its first heartbeat yet (a loaded machine
			// can take longer than the first poll): DEAD, "no runner has
			// ever written a heartbeat", is the truth until then.
			continue
		}
		seen = append(seen, r.State)
		if r.Total.Total > 0 && r.Total.Total < 100_000 {
			sawIngest = true
		}
		if !cancelled && r.Total.InFlight > 0 {
			cancel() // long requests in flight: the drain will use its whole timeout
			cancelled = true
		}
	}
}
