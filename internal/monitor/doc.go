// Package monitor owns the truth about a job: its state (RUNNING, STALLED,
// DOWN, RESTARTING, DONE, DEAD, FAILED, STOPPED) with evidence, the runner's
// heartbeat record, throughput windows and ETA, and alerts on state changes.
//
// Two callers use it. The runner evaluates its live inputs (endpoint states,
// token progress, queued work) with Evaluate and writes the result into its
// heartbeat every few seconds. `regen status` calls Assess, which reads the
// store alone and so works whether the runner is alive or dead: a heartbeat
// older than its deadline makes the job DEAD whatever the last heartbeat
// said, because silence is an alarm, never good news.
//
// States are internal/state's, shared with supervise and fleet. monitor
// also holds two pieces of the runner's bookkeeping that are policy, not
// wiring: AlertQueue (hooks run in order, apart from whoever reports a
// transition) and StoreHealth (when a store outage starts and ends, how
// the periodic writes back off, how rarely it is logged).
//
// The package never prints; views render a Report, and the terminal view
// the Frames a runner publishes. It does not import dispatch: request
// outcomes arrive as plain strings.
package monitor
