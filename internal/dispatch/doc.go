// Package dispatch turns pending samples in the store into requests to LLM
// endpoints and records what happened to each.
//
// A Dispatcher owns three policies and nothing else. Concurrency: a lane
// with a fixed limit has one limiter over all endpoints; a lane with
// LaneConfig.Auto has one adaptive limit per endpoint (limit.Controller),
// stepped by Observe with each probe of that endpoint's metrics and with what
// its requests saw since (tokens, time to first token, errors). Samples are
// claimed from the store only when a lane slot and an endpoint that can take
// a request both exist, about as many as there are free slots, so no lease
// is held for work that is not running; the exception is an auto lane with
// affinity over two or more endpoints, which keeps up to 32 claimed samples
// per endpoint so a slot that frees takes work homed on its endpoint
// (backlog.go), and gives them back when no endpoint takes work, while the
// poison guard is armed, and when Run stops. NoteCrash lowers an endpoint's
// adaptive ceilings after a CUDA out-of-memory crash that followed high KV
// usage, and the auto lanes' sum is held to it; Observe sheds load from an
// endpoint whose KV usage stays pinned at the top (adaptive.go). Balancing is by tokens: each request goes to the endpoint with room
// for its lane whose KV pool would be least full after it, counting every
// request in flight at its estimated footprint (prompt estimate plus the
// lane's mean completion so far), so servers whose pools differ by two get
// work in that ratio; while a pool is unknown (no probe reported it and the
// job file gave none, SetCapacity), the fewest requests in flight decide, ties
// broken round robin. Affinity (affinity.go, off with Config.NoAffinity)
// comes first within the balance: a conversation's next turn goes to the
// endpoint that answered the turn before (as the store remembers it), and a
// request with a long shared system prompt and tool list to that prefix's
// home endpoint, unless the endpoint is not closed or clearly more loaded
// than the least loaded one; the store hands out next turns ahead of new
// samples, and claims wait at start (at most 5 s) until every endpoint
// paused for its start is resumed, so a restarted runner keeps them too.
// Conversation-level admission (admit.go, off with Config.NoAdmission):
// each endpoint holds no more conversations than its KV pool keeps warm
// (their contexts at their peak ahead against 0.95 of the pool, a shared prefix
// counted once, the share moved by what next turns found cached), a new
// conversation waits in the claim while held ones go on, and a held
// conversation's next turn carries the server's request priority where
// it schedules by one (Server.Priority) and every turn its conversation's
// id as the X-SMG-Routing-Key session hint. Workers sharing a store each
// hold conversations against their part of a pool (SetSharers: pool / the
// live workers sending to the endpoint), and drop a held conversation at
// once when a claim shows another worker took its next turn.
// A next turn may go back to its endpoint over its auto limit (by at most a
// tenth of it), since the slot its last turn freed is often taken by
// another turn first; and an endpoint whose requests mostly came back for
// a cached prefix keeps a short queue at its server (limit's cache band). When the store has no more of a lane, requests of that
// lane still waiting in one server's queue (no token yet) move to a server
// with room and an empty queue, without spending an attempt. Failure handling: a server-down error
// releases the sample without spending an attempt and opens that endpoint's
// circuit breaker (open for BreakerCooldown, doubled after every failed
// half-open probe up to 30 s; any answer from the server closes it),
// unless the server evidently works (fault.go): no other sample failed
// there and it was not paused since the request started, and other
// requests streamed meanwhile; then the breaker stays closed, and a sample
// that fails so again (a stream cut every time, a prompt that stalls the
// server) spends an attempt, waits at least half its Delay and is
// dead-lettered with the evidence once MaxAttempts are spent. For that
// the dispatcher remembers, in memory and bounded, which samples failed
// with a server-down error. Backpressure (HTTP 429, or 503 with
// Retry-After) releases the sample without an attempt and holds the
// endpoint for the server's Retry-After (the breaker's cooldown without
// one); at the start of a hold an auto lane's limit backs off and the
// fixed lanes' share of that endpoint is capped at half what it had in
// flight, growing back by one per answer.
// Burn guard (burn.go): a server error (HTTP 5xx, or an answer that is not
// the API: llm.Error.EndpointFault) spends no attempt unless the same
// sample failed so before while the endpoint has since answered a request
// sent after that failure, or it failed BrokenStreak times in a row with
// nothing answered while its lane's store had no other sample to send (the
// last samples of a job: there fewer than BrokenStreak samples never break
// an endpoint, so the job always ends, at the price of those few samples'
// attempts if the server broke just then); otherwise the sample is
// deferred unspent (store.OpDefer). BrokenStreak (its own setting: the
// poison guard off leaves it on) distinct samples in a row failing on one
// endpoint with the same error, or, while other work waits, twice as many
// server errors, with nothing answered there meanwhile, make the endpoint
// broken: its breaker opens (DOWN, the error
// as evidence; EndpointStats.BrokenSince), one probe at a time goes through,
// and its first answer ends it. Every endpoint broken for BrokenAfter stops
// Run with a BrokenError, every unfinished sample pending.
// Other retryable and malformed answers spend an attempt and return the sample to
// pending after Delay, or dead-letter it once MaxAttempts are spent; a bad
// request is dead-lettered after one try with the server's message; a result
// truncated by max_tokens escalates to the lane's EscalateTo lane when it has
// one and is otherwise stored and counted as truncated. In the job's tail
// (no work of the lane or of its EscalateTo lane waits in the store), a
// request past LaneConfig.BackupAt of its max_tokens gets a backup: the
// same turn sent at once in the EscalateTo lane, under the same lease. The
// first request's answer decides as it would alone: it is stored if it
// fits (the backup is cancelled), and if it is truncated the backup's
// answer is stored as the escalated attempt (Store.Relane, then the usual
// commit). A failed backup changes nothing (hedge.go). An auto lane whose
// own work ran out leaves the last escalations put into it (up to half the
// endpoints' KV pools at full length) in the store until the lanes that
// escalate into it have sent their fresh work, the job's possible chain
// heads, then claims them at once (chains.go).
//
// Every claim is one request: the claimed sample's current turn, built by
// package conversation from the sample's plan and the answers the store
// handed over for its earlier turns. An answer that is not escalated goes
// through the Quality rules (a refused one is stored as rejected with its
// rule and evidence); an accepted one completes the sample when it is the
// plan's last turn or when the dataset cannot follow it (a tool call that
// does not match the recorded one: the sample ends there with the reason),
// and otherwise is stored with CompleteTurn, which returns the sample to
// pending at the next turn, in the lane LaneFor picks for the longer
// prompt. So a kill between turns loses nothing and redoes no turn, and
// lanes, retries and escalation apply per turn.
//
// Poison guard: until the server accepts a request (a streamed token or an
// answer), at most PoisonAfter requests run at once, one fewer for every
// sample refused with the same error; PoisonAfter distinct samples refused
// with identical errors in a row stop Run with a PoisonError naming the
// error and the request fields it mentions, and the samples it refused go
// back to pending. Refusals are bad requests (dead-lettered, requeued when
// the guard trips) and, sent back unspent at once, HTTP 401, 403 and 404
// (a key or a model the server does not know) and a 5xx from a live
// server; when every sample left was refused so, the guard trips with
// fewer. A configuration the server rejects (an unsupported parameter, a
// wrong model name or key, a server failing everything) so costs
// PoisonAfter requests, not the dataset. Once a request was accepted these
// errors go their usual ways.
//
// Retry policy lives only here and its state (attempts, not_before) only in
// the store: the dispatcher keeps no per-sample memory between claims but
// the bounded memory of server-down failures above, which only decides
// whether the next one spends an attempt, so a restarted runner continues
// where the store says.
//
// The fleet drives Pause and Resume: Pause cancels an endpoint's
// in-flight requests and releases their samples without spending attempts,
// Resume closes its breaker and sends to it again. Snapshot gives the live
// counts, per-endpoint token times for hang detection and breaker states,
// and each endpoint's KV pool, last load, committed tokens and per-lane
// limits with the decisions that set them (for status, the dashboard and
// metrics). Endpoint, Totals, Counters, StoreState and LaneStats read one piece of
// that state without copying the rest (view.go); AutoLimit is the auto
// lanes' limit held to their shared crash ceiling, applied here only.
//
// The store is the source of truth, and it may go away for a while (a
// PostgreSQL restart, a network cut): every store call is then retried with
// backoff from 100 ms up to 5 s for as long as it takes, results wait in
// memory (bounded by the lanes' concurrency, since nothing is claimed
// meanwhile), Snapshot().Store says DOWN with the last error, and dispatch
// resumes where it was when the store answers again, extending its leases
// first. Nothing is lost: a result is counted only once its commit returned.
// Every outcome is committed with the fencing token of the claim it ran
// under: when the lease is gone meanwhile (this worker was frozen or cut off
// past dead_after and another took the sample, even if this one has claimed
// it again since), the store refuses it, and the outcome is dropped, counted
// (Counters.LeaseLost) and logged as "lease lost; outcome dropped".
//
// Retries, free releases on a working server, backpressure holds and the
// decisions that move an adaptive limit are logged, one line per event
// kind and endpoint every 10 s at most, with the number held back.
//
// Several dispatchers, in several processes, may share one store: each
// claims only the lanes in Config.Serve (all by default) and sends only to
// its own endpoints. Ingest may run alongside: until Config.IngestDone is
// closed, an empty queue means "not yet", not "finished".
//
// The dispatcher takes a store.Queue, the one store role it uses (claim,
// extend leases, Commit, release, expire, counts, requeue dead; its test
// fake implements only that and passes storetest.RunQueue), and settles
// every request as one typed store.Transition. Files: dispatch.go (the
// Dispatcher, New, Run, drain), config.go, burn.go (the burn guard), claim.go (the claim loop),
// work.go and turn.go (one request), outcome.go (verdict and transition),
// hedge.go (backups), balance.go, affinity.go, backlog.go and admit.go, adaptive.go and
// limiter.go, storecall.go (store calls that outlast an outage),
// control.go (Pause, Resume, SetLaneLimit, Snapshot).
//
// Run ends when no sample of its lanes is pending or leased. When its context
// ends it stops claiming, lets in-flight requests finish for up to
// DrainTimeout and releases the rest. Every goroutine it starts ends before
// Run returns. The package never prints; it logs to the Logger it is given.
package dispatch
