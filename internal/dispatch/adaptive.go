package dispatch

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/engine"
)

// epLane is one lane's state on one endpoint (guarded by Dispatcher.mu).
type epLane struct {
	inflight int
	peak     int               // most in flight at once since the last observation
	ctl      *limit.Controller // nil for a lane with a fixed limit
	// Requests sent here since the last observation, and how many of them
	// for a prefix the affinity rule expects cached here; reuse is whether
	// most did, in the last interval that sent any (limit.Sample.Reuse).
	sent, kept int
	reuse      bool
	// over counts requests in flight that were sent over the limit
	// (returnRoomLocked); the controller is fed the rest. overNext marks
	// the endpoint pickLocked just chose that way.
	over     int
	overNext bool
}

// load is what the dispatcher knows of one endpoint's server: its KV pool,
// its last metrics and what its own requests saw since the last probe
// (guarded by Dispatcher.mu).
type load struct {
	capacity       float64 // KV pool in tokens; 0 = unknown
	capacitySource string
	committed      float64 // token estimates of the requests in flight

	metrics   engine.Metrics
	metricsAt time.Time
	movedAt   time.Time  // metricsAt of the probe that last let it take over queued requests
	kvRecent  [3]float64 // the last KV usages, newest first; -1 = unknown
	// sinceShed counts probes since the last shed: readings taken before
	// the server let the cancelled requests go would count them again.
	sinceShed int

	// Since the last observation (obsAt).
	obsAt    time.Time
	tokensAt int64
	peak     int
	ttftSum  time.Duration
	ttftN    int
	errs     int
	// The server's retraction and generated-token counters at the last
	// observation.
	retracted     float64
	haveRetracted bool
	retractedAt   time.Time // the last probe that saw the counter rise
	genTotal      float64
	haveGen       bool
}

// readRetractions returns the retractions since the last probe (-1 when
// unknown) and keeps the counter.
func (ld *load) readRetractions(m engine.Metrics, at time.Time) float64 {
	if !m.Present.Has(engine.FieldRetractionsTotal) {
		return -1
	}
	retracted := -1.0
	if ld.haveRetracted {
		retracted = m.RetractionsTotal - ld.retracted
		if retracted < 0 { // the server restarted: its counter did too
			retracted = m.RetractionsTotal
		}
	}
	ld.retracted, ld.haveRetracted = m.RetractionsTotal, true
	if retracted > 0 {
		ld.retractedAt = at
	}
	return retracted
}

// forgetKV marks every recent KV usage unknown.
func (ld *load) forgetKV() { ld.kvRecent = [3]float64{-1, -1, -1} }

// Capacity sources, for Snapshot.
const (
	CapacityServer = "server" // the server's metrics or /get_server_info
	CapacityJob    = "job"    // the job file (regen plan's figure for a launched server)
)

// SetCapacity gives the KV pool of the endpoint at url before its server
// reports one (the job file's kv_tokens, regen plan's figure); a figure
// the server reports replaces it.
func (d *Dispatcher) SetCapacity(url string, tokens float64, source string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.epByURL[url]
	if !ok || tokens <= 0 || e.load.capacitySource == CapacityServer {
		return
	}
	e.load.capacity, e.load.capacitySource = tokens, source
}

// LimitDecision is a change or judgement of one adaptive limit.
type LimitDecision struct {
	Endpoint string
	Lane     string
	limit.Decision
}

// Observe feeds one probe of the server at url: its KV pool and load
// metrics taken at time at. Every auto lane's controller on that endpoint
// takes one step with the metrics and with what the dispatcher's own
// requests saw since the last observation (tokens streamed, time to first
// token, errors). A paused endpoint only refreshes what is known of it.
// The decisions are returned for logging; the latest stays in Snapshot.
func (d *Dispatcher) Observe(url string, m engine.Metrics, at time.Time) []LimitDecision {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.epByURL[url]
	if !ok {
		return nil
	}
	ld := &e.load
	out := d.rescaleLocked(e, m, at)
	kv := -1.0
	if m.Present.Has(engine.FieldTokenUsage) {
		kv = m.TokenUsage
	}
	copy(ld.kvRecent[1:], ld.kvRecent[:len(ld.kvRecent)-1])
	ld.kvRecent[0] = kv
	ld.sinceShed++
	ld.metrics, ld.metricsAt = m, at

	retracted := ld.readRetractions(m, at)
	interval := at.Sub(ld.obsAt)
	tokens := e.tokens.Load()
	// Goodput from the server's own counter when it has one (exact, whatever
	// the chunking); else from the chunks streamed to us.
	goodput := float64(tokens-ld.tokensAt) / interval.Seconds()
	if m.Present.Has(engine.FieldGenerationTokensTotal) {
		if ld.haveGen && m.GenerationTokensTotal >= ld.genTotal {
			goodput = (m.GenerationTokensTotal - ld.genTotal) / interval.Seconds()
		}
		if ld.haveGen && m.GenerationTokensTotal > ld.genTotal && at.After(e.servedAt) {
			e.servedAt = at // the server generates: evidence for fault.go
		}
		ld.genTotal, ld.haveGen = m.GenerationTokensTotal, true
	}
	if !e.paused && !ld.obsAt.IsZero() && interval > 0 {
		s := limit.Sample{
			Time:             at,
			EndpointInFlight: e.inflight,
			Goodput:          goodput,
			Errors:           ld.errs,
			Running:          metric(m, engine.FieldRunning, m.Running),
			Queued:           metric(m, engine.FieldQueued, m.Queued),
			Slots:            max(metric(m, engine.FieldSlots, m.Slots), 0),
			KVUsage:          kv,
			Retractions:      math.Max(retracted, 0),
		}
		if ld.ttftN > 0 {
			s.TTFT = ld.ttftSum / time.Duration(ld.ttftN)
		}
		raised := false
		waiting, allWaiting := e.waitingLocked(len(e.lanes))
		for i := range e.lanes {
			el := &e.lanes[i]
			if el.ctl == nil {
				continue
			}
			s.InFlight, s.Peak = el.inflight-el.over, max(el.peak, el.inflight)-el.over
			s.Waiting, s.OthersWaiting = waiting[i], allWaiting-waiting[i]
			s.Reuse = el.reuseLocked()
			dec := el.ctl.Update(s)
			raised = raised || dec.To > dec.From
			out = append(out, LimitDecision{url, d.lanes[i].cfg.Name, dec})
		}
		if raised {
			d.signal()
		}
		out = append(out, d.shedLocked(e, kv, at)...)
	}
	// A paused endpoint starts a fresh interval when it comes back, so
	// its downtime does not read as a collapse of goodput.
	if e.paused {
		at = time.Time{}
	}
	ld.obsAt, ld.tokensAt = at, tokens
	ld.peak, ld.ttftSum, ld.ttftN, ld.errs = e.inflight, 0, 0, 0
	for i := range e.lanes {
		e.lanes[i].peak = e.lanes[i].inflight
	}
	d.logDecisions(out, at)
	return out
}

// rescaleLocked follows a server that reports another KV pool than before
// (restarted with another size): its auto lanes' limits and shared
// ceiling scale with it.
func (d *Dispatcher) rescaleLocked(e *endpoint, m engine.Metrics, at time.Time) []LimitDecision {
	ld := &e.load
	if !m.Present.Has(engine.FieldMaxTotalTokens) || m.MaxTotalTokens <= 0 {
		return nil
	}
	var out []LimitDecision
	if old := ld.capacity; old > 0 && old != m.MaxTotalTokens && ld.capacitySource == CapacityServer {
		for i, el := range e.lanes {
			if el.ctl != nil {
				out = append(out, LimitDecision{e.url, d.lanes[i].cfg.Name, el.ctl.Rescale(at, old, m.MaxTotalTokens)})
			}
		}
		if e.ceiling > 0 { // the auto lanes' shared ceiling follows theirs
			e.ceiling = e.lanesCeilingLocked()
		}
	}
	ld.capacity, ld.capacitySource = m.MaxTotalTokens, CapacityServer
	return out
}

// logDecisions writes the decisions that moved a limit to the run log, at
// most one line per endpoint and lane every 10 s (probes can come every
// second); the latest stays in Snapshot.
func (d *Dispatcher) logDecisions(out []LimitDecision, now time.Time) {
	for _, dec := range out {
		if dec.To == dec.From && dec.Action != limit.Shed && dec.Action != limit.Ceiling {
			continue
		}
		d.logs.log(d.log, slog.LevelInfo, "limit:"+dec.Endpoint+":"+dec.Lane, "limit", now,
			"endpoint", dec.Endpoint, "lane", dec.Lane, "from", dec.From, "to", dec.To, "action", string(dec.Action), "reason", dec.Reason)
	}
}

// Shedding. KV usage pinned at the top is what precedes an out-of-memory
// crash (the seed's server died that way), and a lower limit cannot bring
// usage down for minutes: the requests running keep growing until they
// finish, and the server admits the ones waiting in its queue as soon as
// anything fits. So when KV usage stays at or above pinnedKV for two
// probes in a row, or rises shedAbove over the back-off level a crash
// under pressure set (0.9, lower if it crashed lower), the dispatcher
// cancels there every request of an auto lane still waiting (nothing
// lost: no token yet) and running ones until their footprint (prompt and
// tokens generated) brings usage back to shedTarget (the back-off level
// after a crash), the ones with the least generated first, as their work is
// the cheapest to lose. All go back to pending without spending an
// attempt, and each auto lane's limit drops to what it has left. A crash
// loses every request in flight and the minutes of a restart. Measured
// with bench/sweep: on a server that crashes after 10 s at 0.97, half the
// runs finished without a crash (none did before); on servers that do not
// crash, the goodput of auto moved by 1-2%.
const (
	pinnedKV   = 0.97
	shedTarget = 0.9
	shedAbove  = 0.05
)

// shedLocked sheds load from e as the comment above says; it returns the
// limit decisions of the auto lanes it cut.
func (d *Dispatcher) shedLocked(e *endpoint, kv float64, at time.Time) []LimitDecision {
	if e.load.capacity <= 0 || !e.hasAutoLocked() {
		return nil
	}
	var trigger string
	target := shedTarget
	switch {
	case e.load.sinceShed < 2:
		return nil
	case e.ceiling > 0 && kv >= e.crashKV+shedAbove:
		trigger = fmt.Sprintf("KV usage %.2f on a server that crashed under pressure", kv)
		target = e.crashKV
	case e.load.kvRecent[0] >= pinnedKV && e.load.kvRecent[1] >= pinnedKV:
		trigger = fmt.Sprintf("KV usage %.2f, %.2f at the last two probes", e.load.kvRecent[1], e.load.kvRecent[0])
	default:
		return nil
	}
	perLane := make([]int, len(e.lanes))
	backups := 0 // cancelled backups hold no sample: nothing is released
	shed := func(cl *call) {
		cl.shed = true
		cl.cancel(errShed)
		perLane[cl.lane.idx]++
		if cl.backup {
			backups++
		}
	}
	var running []*call
	waiting := 0
	for cl := range e.calls {
		switch {
		case cl.shed || cl.moved || cl.lane.auto == nil: // moved: already on its way; a fixed lane's load is the user's
		case !cl.streaming.Load():
			shed(cl)
			waiting++
		default:
			running = append(running, cl)
		}
	}
	slices.SortFunc(running, shedOrder)
	need := (kv - target) * e.load.capacity
	freed, lost, n := 0.0, 0.0, 0
	for _, cl := range running {
		if freed >= need {
			break
		}
		shed(cl)
		freed += cl.prompt + cl.tokensLocked()
		lost += cl.tokensLocked()
		n++
	}
	if n+waiting == 0 {
		return nil
	}
	d.counters.Shed += int64(n + waiting - backups)
	e.load.sinceShed = 0
	why := fmt.Sprintf("%s: %d running requests cancelled (about %.0f tokens of KV, %.0f of them generated) and %d waiting, released without spending an attempt", trigger, n, freed, lost, waiting)
	if backups > 0 {
		why += fmt.Sprintf(" (%d of them backups, whose first requests go on)", backups)
	}
	var out []LimitDecision
	for i := range e.lanes {
		el := &e.lanes[i]
		if el.ctl == nil {
			continue
		}
		out = append(out, LimitDecision{e.url, d.lanes[i].cfg.Name, el.ctl.Shed(at, el.inflight-perLane[i], why)})
	}
	return out
}

// shedOrder is the order running requests are shed in: backups first
// (speculative work), then the fewest tokens generated, then the newest.
func shedOrder(a, b *call) int {
	if a.backup != b.backup {
		if a.backup {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.generated.Load(), b.generated.Load()); c != 0 {
		return c
	}
	return b.start.Compare(a.start)
}

// waitingLocked counts the requests on e that have not started streaming
// (waiting in the server's queue or in prefill), per lane and in all.
func (e *endpoint) waitingLocked(lanes int) (perLane []int, all int) {
	perLane = make([]int, lanes)
	for cl := range e.calls {
		if cl.shed || cl.moved || cl.streaming.Load() {
			continue
		}
		perLane[cl.lane.idx]++
		all++
	}
	return perLane, all
}

func metric(m engine.Metrics, f engine.Field, v float64) float64 {
	if m.Present.Has(f) {
		return v
	}
	return -1
}

func (e *endpoint) hasAutoLocked() bool {
	for _, el := range e.lanes {
		if el.ctl != nil {
			return true
		}
	}
	return false
}

// crashKV is the KV usage that, held over the last probes before a crash
// with an out-of-memory signature, makes it a crash under pressure; on a
// server that crashed under pressure before, crashNear below the level
// its auto lanes back off at is enough.
const (
	crashKV   = 0.9
	crashNear = 0.1
)

// NoteCrash tells the dispatcher that the server at url went down with
// cause (an engine.Cause* from its log). A CUDA out-of-memory crash after
// KV usage stayed at or above 0.9 over the last probes (after a first
// such crash, within 0.1 of the level the lanes back off at) is a crash
// under pressure: every auto lane's controller on that endpoint lowers its
// ceiling (limit.Controller.Crashed) before the server comes back, to a
// share of what the endpoint had in flight over all lanes, the auto lanes'
// sum is held to it, and their back-off level follows the KV usage it
// crashed at. The decisions are returned for events and logs; a crash
// that does not qualify returns nil, and so does one on an endpoint with
// no auto lane (whose fixed limits the user owns) except for one decision
// saying so.
func (d *Dispatcher) NoteCrash(url, cause string, at time.Time) []LimitDecision {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.epByURL[url]
	if !ok {
		return nil
	}
	ld := &e.load
	// Whatever the cause, the readings are the crashed server's: the one
	// that comes back starts without them, so an out-of-memory crash soon
	// after a restart is judged on what the new server showed.
	recent := ld.kvRecent
	ld.forgetKV()
	if cause != engine.CauseCUDAOOM {
		return nil
	}
	// A server that crashed under pressure before counts again near the
	// level it was held to; one that crashed while nearly empty (right
	// after a restart) did not crash for its KV usage.
	near := crashKV
	if e.ceiling > 0 {
		near = min(near, e.crashKV-crashNear)
	}
	high, nearN := 0, 0
	level := 1.0 // the KV usage it crashed at: the lowest of the last probes
	for _, kv := range recent {
		if kv >= crashKV {
			high++
		}
		if kv >= near {
			nearN++
			level = min(level, kv)
		}
	}
	if nearN < 2 {
		return nil
	}
	why := fmt.Sprintf("%s with KV usage %s over the last probes", cause, kvList(recent[:]))
	if high < 2 {
		why += ", on a server that crashed under pressure before"
	}
	crashed := max(ld.peak, e.inflight)
	backOffKV := 0.0
	var out []LimitDecision
	for i := range e.lanes {
		el := &e.lanes[i]
		l := d.lanes[i]
		if el.ctl == nil {
			out = append(out, LimitDecision{url, l.cfg.Name, limit.Decision{Time: at, From: l.cfg.Concurrency, To: l.cfg.Concurrency,
				Action: limit.Hold, Reason: fmt.Sprintf("crash under pressure (%s); the lane's limit is fixed (concurrency: auto would lower it)", why)}})
			continue
		}
		out = append(out, LimitDecision{url, l.cfg.Name, el.ctl.Crashed(at, crashed, level, why)})
		backOffKV = max(backOffKV, el.ctl.CrashKV())
	}
	// The auto lanes share the ceiling: their sum may not pass it.
	if ceiling := e.lanesCeilingLocked(); ceiling > 0 {
		e.ceiling, e.crashKV = ceiling, backOffKV
	}
	return out
}

func kvList(kv []float64) string {
	s := ""
	for i := len(kv) - 1; i >= 0; i-- {
		if kv[i] < 0 {
			continue
		}
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%.2f", kv[i])
	}
	return s
}

// loadStatsLocked fills the capacity, load and per-lane fields of es.
func (d *Dispatcher) loadStatsLocked(e *endpoint, es *EndpointStats) {
	ld := &e.load
	es.KVTokens, es.KVTokensSource, es.CommittedTokens = ld.capacity, ld.capacitySource, ld.committed
	if !ld.metricsAt.IsZero() {
		m := ld.metrics
		es.Load = &ServerLoad{At: ld.metricsAt, Running: metric(m, engine.FieldRunning, m.Running), Queued: metric(m, engine.FieldQueued, m.Queued),
			KVUsage: metric(m, engine.FieldTokenUsage, m.TokenUsage), RetractionsTotal: metric(m, engine.FieldRetractionsTotal, m.RetractionsTotal)}
	}
	for i, el := range e.lanes {
		el2 := EndpointLane{Lane: d.lanes[i].cfg.Name, InFlight: el.inflight}
		if el.ctl != nil {
			dec, moved := el.ctl.Last(), el.ctl.Moved()
			el2.Auto, el2.Limit, el2.Ceiling, el2.Decision, el2.Moved = true, el.ctl.Limit(), el.ctl.Ceiling(), &dec, &moved
		} else {
			el2.Limit = d.lanes[i].cfg.Concurrency
		}
		es.Lanes = append(es.Lanes, el2)
	}
}
