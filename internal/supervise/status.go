package supervise

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/state"
)

// State is a supervised server's condition, in the vocabulary monitor
// and the fleet share (internal/state). The supervisor uses Starting,
// Ready, Degraded, Stalled, Down, Restarting, Failed and Stopped.
type State = state.State

// Server states.
const (
	Starting   = state.Starting
	Ready      = state.Ready
	Degraded   = state.Degraded   // serving, but a probe failed or retractions are frequent
	Stalled    = state.Stalled    // alive but not generating: about to be restarted
	Down       = state.Down       // a process of the group exited or a fatal line was logged
	Restarting = state.Restarting // the old group is gone; waiting out the backoff
	Failed     = state.Failed     // too many failures within the window; Run has returned
	Stopped    = state.Stopped    // Run's context was cancelled and the group is gone
)

// Causes the supervisor itself assigns; causes read from the log are the
// engine.Cause* constants and take precedence for DOWN.
const (
	CauseExit         = "exit"          // the group leader exited
	CauseChildExit    = "child_exit"    // another process of the group exited
	CauseStart        = "start"         // the command could not be started
	CauseReadyTimeout = "ready_timeout" // not ready within Server.ReadyTimeout
	CauseHang         = "hang"          // requests in flight, no token for HangTimeout
	CauseHealth       = "health"        // health probe failed ProbeFailures times in a row
	CauseHealthProbe  = "health_probe"  // one or a few failed probes (DEGRADED)
	CauseNoGeneration = "no_generation" // work queued, no sign of generation for StallTimeout
	CauseRetractions  = "retractions"   // frequent KV retractions (DEGRADED)
	CauseStopped      = "stopped"
)

// Status is a snapshot of the supervised server.
type Status struct {
	State    State     `json:"state"`
	Since    time.Time `json:"since"`
	Cause    string    `json:"cause,omitempty"`
	Evidence []string  `json:"evidence,omitempty"`
	Restarts int       `json:"restarts"`
	PID      int       `json:"pid,omitempty"` // group leader (= process group id); 0 when none runs
	URL      string    `json:"url"`
	// Metrics is the last successful scrape, taken at MetricsAt.
	Metrics   engine.Metrics `json:"metrics"`
	MetricsAt time.Time      `json:"metrics_at"`
}

func (s Status) clone() Status {
	s.Evidence = slices.Clone(s.Evidence)
	return s
}

// FailedError is returned by Run when the restart policy is exhausted.
type FailedError struct {
	Cause    string
	Evidence []string
	Failures int           // failures counted within Window
	Window   time.Duration // the restart policy's window
}

func (e *FailedError) Error() string {
	msg := fmt.Sprintf("server failed %d times within %v, last cause %s", e.Failures, e.Window, e.Cause)
	if len(e.Evidence) > 0 {
		msg += ": " + strings.Join(e.Evidence, "; ")
	}
	return msg
}
