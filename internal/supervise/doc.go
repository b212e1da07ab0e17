// Package supervise runs one inference server as a child process group and
// tells the truth about it.
//
// A Supervisor launches the server with the engine dialect's argument list
// (never through a shell) in its own process group, copies its merged
// stdout and stderr into a rotating log file and through the dialect's log
// parser, and waits for readiness by the engine's rule. It then watches:
// the exit of the group leader (seen at once through wait), the exit of any
// other process of the group (SGLang's scheduler can die while its HTTP
// process stays up, so /proc is polled for the group's members), fatal log
// signatures (recorded as the cause), hangs (requests in flight but no token
// for HangTimeout, or the health probe failing ProbeFailures times in a
// row), and stalls (health fine but no sign of generation with work queued
// for StallTimeout).
//
// Every state change (STARTING, READY, DEGRADED, STALLED, DOWN, RESTARTING,
// FAILED, STOPPED: the vocabulary of internal/state, which monitor and fleet
// share, so no translation sits between them) is reported through Config.OnState from the goroutine
// that called Run, with evidence. On DOWN or STALLED the supervisor kills
// the whole group (SIGTERM, then SIGKILL after a grace period), waits until
// every member is gone and, when nvidia-smi is available, until none of the
// old PIDs holds GPU memory, then restarts with exponential backoff. After
// Restart.Max failures within Restart.Window it reports FAILED and Run
// returns a *FailedError (Max 1 means never restart).
//
// Children are watched from readiness on: those alive when the server
// becomes ready at once, later ones once they have lived ChildMinAge, so
// short-lived helpers (compilers, nvidia-smi calls) are not mistaken for a
// crash. Processes that leave the group (setsid, Ray workers) are not seen.
//
// The supervisor never pauses dispatch itself: the caller (fleet) does that
// from OnState. It kills only the process group it started.
//
// Files: supervise.go (the Supervisor and its state), config.go (Config and
// defaults), incarnation.go (one launch and its clean-up), judge.go (the
// watch loop and its rules), restart.go (RestartPolicy), group.go (the
// process group), logfile.go and logwatch.go (the server's log), ready.go
// (ports and WaitReady).
package supervise
