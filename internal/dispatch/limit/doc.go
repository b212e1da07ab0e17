// Package limit holds the adaptive concurrency controller behind a lane's
// `concurrency: auto`: one Controller per endpoint and lane, a pure function
// of the probe samples it is fed (no clock, no goroutine, no lock; the
// dispatcher serialises the calls and owns the time). It decides how many
// requests of its lane the endpoint may have in flight, and says why.
//
// # What it keeps the server at
//
// An LLM server decides itself what fits its KV pool: SGLang admits a
// waiting request when its prompt and a reserved share of its max_tokens
// fit (the new-token ratio), vLLM and llama.cpp do likewise, and all of them
// retract or preempt when the guess was wrong. The best a client can do is
// keep enough work waiting that the server's own admission fills the pool at
// every step, and no more than that: work waiting at one server cannot move
// to another with room, is lost to a crash, and waits out time-outs. So the
// controller holds the server's waiting queue in a band of 0.5 to 1.5 times
// the requests it is running (with a floor of 4 to 12): about one generation
// of work waiting. The band was chosen with bench/sweep: a tighter one (0.05
// to 0.15) kept KV usage near 0.9 instead of the server's own 0.95 and lost
// 5 to 7% of goodput on a 231,120-token pool. A deeper queue does not fill
// the pool more: on kv231k a fixed 300/64 (about 190 waiting) ran 60
// requests at KV 0.905 through the bulk, auto 58 at 0.909, and both spent
// the same KV-time; 300/64's 4% more goodput on that 800-prompt job came
// from the order the FCFS server served the job's end in (every prompt
// at the server early, the long lane's later prompts behind them), and at
// 1,600 prompts or with other output seeds auto is within 1.5% of it.
//
// Work that comes back for a cached prefix (Sample.Reuse: a conversation's
// next turn on the server that answered the turn before, rows sharing a
// system prompt) gets a band of 0.1 to 0.3 times the running requests: a
// request waiting in the server's queue does not hold its prefix, and the
// running requests evict it as the pool fills. On bench/sweep's mt4 (four
// servers, 3,200 glaive-shaped conversations) the default band kept 50-70
// waiting behind 60-75 running, each turn waited about 13 simulated
// seconds, and the prefix-cache hit rate fell to 37%.
//
// A slot-bound server (llama-server: --parallel N slots, each a fixed
// share of the context) has no pool to fill: its slots are its hard
// limit and a waiting request only waits. When the probe reports slots
// (Sample.Slots) the limit is capped at them and the band becomes 0 to 1
// waiting. Measured with bench/slots (the simulator's llama.cpp mode, 8
// slots; three runs of 200-400 prompts): auto held 8 in flight with a
// time to first token (p50) of 0.91-1.02x that of a fixed limit of 8;
// taken for SGLang, the same server got 86-108 in flight and 260-408x
// the time to first token.
//
// # The algorithm, and why this one
//
// The literature on adaptive concurrency limits offers three families:
//
//   - Loss-based AIMD (TCP Reno; Chiu and Jain's proof that additive
//     increase and multiplicative decrease converge to a fair share):
//     raise by a constant while nothing is lost, halve on a loss. Its loss
//     signal here would be a retraction, which comes late: a request's KV
//     grows with its output, so the pool overflows minutes after the
//     admissions that overfilled it, and a loss-driven limit overshoots by
//     the whole pipeline before it learns anything.
//   - Delay-based, Vegas-style (TCP Vegas; Netflix concurrency-limits'
//     VegasLimit): infer the queue as limit x (1 - RTT_noload / RTT) and keep
//     it between alpha and beta. The inference is needless here: every engine
//     reports its waiting queue (SGLang num_queue_reqs, vLLM
//     num_requests_waiting, llama.cpp requests_deferred), so the controller
//     reads the queue instead of guessing it from latencies that vary a
//     hundredfold with output length.
//   - Gradient (Netflix Gradient2, Envoy's adaptive concurrency filter):
//     compare a short-run latency with a long-run or minimum one and scale
//     the limit by the ratio. For a batch job the latency that matters,
//     time to first token, is the queue wait itself.
//
// The controller is Vegas on the measured queue, with AIMD's slow start and
// multiplicative decrease for the signals that mean real trouble:
//
//   - Slow start: from the initial limit (4 by default, deliberately low)
//     the limit triples each probe while the queue is at or below the band
//     and the lane fills its limit, as TCP's slow start finds the order of
//     magnitude in a few round trips (tripling is about BBR's startup gain,
//     2/ln 2; doubling cost 3% of goodput on a 200-second job of short
//     outputs); it ends at the first queue in the band, or when KV usage
//     reaches half the pool (SlowStartKV) with the queue still short: the
//     requests a tripling admitted grow their KV as they decode, and the
//     queue shows the full pool a probe or two after the tripling that
//     overfilled it. On bench/sweep's mt4 slow start overshot to 118-175
//     per server, was cut to 83-96, and conversations' next turns waited
//     out the cut while their prefixes were evicted; ending at half the
//     pool raised mt4's goodput 3-4% and its p99 time to first token fell
//     from 20-25 to 7 simulated seconds, with the single-server workloads'
//     goodput unchanged (within their spread).
//   - In the band: hold. Below it: raise by 5% (by 25% while the queue is
//     empty, by 50% while it is empty and KV usage is below 0.7). A limit the
//     lane does not fill is not raised (TCP's congestion window validation).
//     The queue is the server's, shared by the endpoint's lanes: a lane
//     that fills its limit with fewer of its own requests waiting than its
//     share of the band's low end (its share of the endpoint's requests in
//     flight) while the other lanes' requests wait is raised by 5% in the
//     band too. Otherwise a lane cut low (a shed took the long lane from 65
//     to 7 on bench/sweep's kv231k) stayed low for the rest of the job, the
//     short lane's queue holding it in the band, and the escalations of
//     truncated answers, the job's longest chains, waited at the client
//     for a long request to finish.
//   - Above the band: cut to what is in flight minus this lane's share of
//     the excess over the band's middle (at most 30% at once), then wait for
//     the cut to take effect (the lane back within its limit) before judging
//     the queue again, so one long queue is not counted twice.
//   - Multiplicative decrease (x0.8, then two samples without a raise) on a
//     retraction or preemption burst (at least 10% of the running requests,
//     and 5, in one interval), on KV usage at or above 0.99 for 3 probes in a
//     row, on errors the server answered (429, a 5xx from a live server),
//     and, only when the engine reports no queue, on a rising time to first
//     token (a short-run average 2.5 times the long-run one, Gradient2's
//     test). Outages are the circuit breaker's, not the limit's.
//   - Goodput must rise: a raise of a fifth or more that bought less than a
//     fifth of its size in goodput (tokens per second, from the server's
//     generation counter), twice in a row, holds the limit for 12 probes
//     before probing upwards again, as Envoy's filter periodically
//     re-measures instead of trusting an old optimum. A raise after which
//     the server's running requests fell is not judged: requests finished
//     faster than the raise added them (a job's tail), and goodput fell
//     with the batch whatever the limit. Judged there, the hold kept
//     kv231k's long lane at 10 for 12 probes with the server's queue empty
//     and KV usage falling from 0.84 to 0.5 while escalations waited: the
//     runs that did so measured 1,425-1,475 tokens/s against 1,497-1,499
//     for those that did not (simulator seed 3); with the rule, nine of
//     ten runs measured 1,490-1,499 (one 1,429).
//
// Every decision carries its evidence (queue and band, KV usage,
// retractions, errors, TTFT, in flight against the limit), which regen
// status and the progress view show for the last one that moved the limit.
//
// # A server that crashes under pressure
//
// A limit is a slow lever on KV usage: a request's KV grows until it
// finishes, so a cut shows minutes later. KV usage pinned at 0.97 or above
// for two probes therefore makes the dispatcher shed load at once (cancel
// the requests still waiting at the server and the running ones with the
// least generated, released without spending an attempt); Shed then drops
// the limit to what the lane has left.
//
// Crashed records a CUDA out-of-memory crash that followed high KV usage:
// the ceiling drops to 0.75 of what the endpoint had in flight over all
// lanes (the dispatcher holds the auto lanes' sum to it; a lane's own
// share would starve a long lane cut to a few requests; never below the
// lane's starting limit, at most 4) and, from then on, KV usage at or above
// a back-off level backs off at once: 0.9, or 0.05 below the KV usage the
// server crashed at if that is lower (never below 0.5). Raises stop 0.1
// below that level (and go by a quarter 0.3 below it: the troughs of the
// saw), and the dispatcher sheds 0.05 above it. Another out-of-memory
// crash of that server at a KV usage within 0.1 of the level lowers the
// ceiling and the level again. Rescale follows a server
// restarted with another KV pool. Bounds (min, max, initial) come from the
// job file.
package limit
