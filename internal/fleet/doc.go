// Package fleet owns each endpoint's truth: what one server is at every
// moment, put together in one place instead of by the runner from
// callbacks and snapshots.
//
// A Fleet has a keeper for its endpoints: a prober for plain URLs (it can
// only watch and report), the in-process simulator (sim with no command),
// or a server process kept alive by internal/supervise. The keeper judges
// health (probes, exits, log signatures, hangs) in the one state vocabulary
// of internal/state. The fleet adds what the dispatcher knows of the same
// endpoint, read one endpoint at a time through Dispatcher.Endpoint, never
// as a whole Snapshot: its counters, the breaker's verdict (a server
// healthy by its probe but failing our requests is DOWN once that has
// lasted breakerSettle), and its limits as dispatch enforces them (the
// auto lanes' crash ceiling is applied in dispatch, AutoLimit, and only
// there). It also checks at readiness that a server serves the job's
// model (and the model recorded for the configuration generation), and
// detects the engine of a URL the job left without one.
//
// Policy on transitions lives here: an endpoint that is not READY or
// DEGRADED is paused in the dispatcher, one that becomes ready again is
// resumed (unless it refuses the job's model), and a crash under KV
// pressure lowers its adaptive ceilings. What the fleet sees goes out
// through a Reporter (store events, alerts, lines for the view); the fleet
// never writes the store or draws itself.
//
// Layering: fleet imports dispatch, supervise, probe, sim, engine, job,
// store and monitor (whose State is internal/state's); nothing but the
// runner imports fleet. The runner builds a Fleet,
// attaches the dispatcher (Attach) and runs it (Run).
package fleet
