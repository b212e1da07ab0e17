package supervise

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// stuckReap models a leader that the kernel never lets go of (a killed
// process in uninterruptible sleep inside a GPU driver): the reap blocks
// until the test ends, then really reaps so no goroutine or zombie is left.
func stuckReap(t *testing.T, cfg *Config) {
	t.Helper()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // registered first, so it runs after start's cleanup
	cfg.reap = func(cmd *exec.Cmd) error {
		<-release
		return cmd.Wait()
	}
	cfg.KillGrace = 200 * time.Millisecond
	cfg.reapGrace = 200 * time.Millisecond
}

func TestUnreapedLeaderStillRestartsAndFails(t *testing.T) {
	cfg := fastConfig(t)
	stuckReap(t, &cfg)
	// The exit is never seen through wait, so readiness times out instead:
	// the server crashes before binding its port.
	cfg.Server.Args = []string{"--crash-after", "0"}
	cfg.Server.ReadyTimeout = 300 * time.Millisecond
	cfg.Server.Restart.Max = 2
	r := start(t, cfg)
	var err error
	select {
	case err = <-r.done:
		r.done <- err
	case <-time.After(20 * time.Second):
		t.Fatalf("Run did not move on after drain gave up on an unreaped leader; states so far: %v", r.rec.states())
	}
	var fe *FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("Run = %v, want *FailedError", err)
	}
	if fe.Failures != 2 {
		t.Errorf("FailedError failures = %d, want 2", fe.Failures)
	}
	want := []State{Starting, Down, Restarting, Starting, Down, Failed}
	if diff := cmp.Diff(want, r.rec.states()); diff != "" {
		t.Errorf("states mismatch (-want +got):\n%s", diff)
	}
}

func TestUnreapedLeaderStopReturns(t *testing.T) {
	cfg := fastConfig(t)
	stuckReap(t, &cfg)
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	pid := r.sup.Status().PID
	r.stopAndCheck(t, pid)
}
