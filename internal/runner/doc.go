// Package runner runs one job end to end: it takes over the job from any dead
// previous runner, ingests the sources (idempotently), starts or finds the
// endpoints (an in-process simulator, a supervised server process, or plain
// URLs), dispatches until every sample is finished, writes a heartbeat and
// state-change events into the store, fires alerts, publishes progress
// frames (monitor.Frame, to Options.Progress: the runner never draws; the
// terminal view subscribes in cmd/regen), and exports the results at the end.
//
// It is the composition root: it wires the concepts and owns none of their
// policy. Endpoints (their health, breaker verdicts, limits, model check,
// pause and resume) live in fleet, ingest in ingest, retries and limits in
// dispatch, process handling in supervise, states, alert hooks and the
// store's outage accounting in monitor, the workers' hand-offs (the runner
// lock, takeover, rescue of gone workers' leases, who exports) in crew. The
// runner keeps the job's own state, its heartbeat and the view's frames. A
// runner that is killed at any point loses nothing: a re-run releases the
// dead runner's leases without spending attempts and resumes.
package runner
