// Package state is the one vocabulary of conditions a job or an endpoint
// can be in. The supervisor, the fleet and monitor all speak it, so a
// server's state passes from the process that watches it to `regen status`
// without a translation. It owns only the words, not how they are judged.
package state

// State is a job's or an endpoint's condition.
type State string

const (
	Starting State = "STARTING"
	Ready    State = "READY"
	Degraded State = "DEGRADED" // serving, but a probe failed or retractions are frequent
	Running  State = "RUNNING"
	// Draining: the runner was interrupted once and finishes the requests
	// in flight (up to its drain timeout) before it stops.
	Draining   State = "DRAINING"
	Stalled    State = "STALLED"    // alive but not generating
	Down       State = "DOWN"       // not serving: exited, refusing or unreachable
	Restarting State = "RESTARTING" // the old server is gone; waiting out the backoff
	Failed     State = "FAILED"     // too many failures; nothing more is tried
	Done       State = "DONE"
	Dead       State = "DEAD"
	Stopped    State = "STOPPED"
)
