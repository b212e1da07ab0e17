package limit

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Bounds are a controller's limits as the job file sets them.
type Bounds struct {
	Min     int // never below this (>= 1)
	Max     int // never above this; 0 = no bound
	Initial int // the first limit
}

// Sample is what one probe interval says about one endpoint, seen from one
// lane. Server-side fields are -1 when the engine does not report them.
type Sample struct {
	Time time.Time
	// InFlight is this lane's requests on the endpoint when sampled, Peak
	// the most it had at once during the interval; EndpointInFlight is the
	// endpoint's requests over all lanes when sampled.
	InFlight         int
	Peak             int
	EndpointInFlight int
	// Goodput is the tokens per second the endpoint streamed over the
	// interval, all lanes (-1 unknown).
	Goodput float64
	// TTFT is the mean time to first token of the requests that started
	// streaming in the interval (0 = none did).
	TTFT time.Duration
	// Errors counts requests that failed in the interval with an error the
	// server answered (5xx from a live server, malformed streams, timeouts);
	// outages are the circuit breaker's business, not the limit's.
	Errors int

	Running float64 // requests the server is decoding
	Queued  float64 // requests waiting at the server
	// Slots is the most requests the server decodes at once when that is
	// its hard limit (llama-server's --parallel); 0 = a KV-pool server.
	Slots float64
	// Reuse: the lane's requests come back to this server for a prefix it
	// holds in its cache (a conversation's next turn, a shared system
	// prompt). A request waiting in the server's queue does not hold its
	// prefix, which the running requests evict as the pool fills, so the
	// queue is kept to the CacheQueue band.
	Reuse       bool
	KVUsage     float64 // 0..1
	Retractions float64 // retracted or preempted requests during the interval
	// Waiting is this lane's requests on the endpoint that have not
	// started streaming (waiting in the server's queue, or in prefill);
	// OthersWaiting the same for the endpoint's other lanes. The server's
	// queue is theirs together (with other clients' requests).
	Waiting, OthersWaiting int
}

// Decision is what the controller did with one sample, with the evidence,
// for status lines and events.
type Decision struct {
	Time   time.Time `json:"time"`
	From   int       `json:"from"`
	To     int       `json:"to"`
	Action Action    `json:"action"`
	Reason string    `json:"reason"`
}

// Action names a decision.
type Action string

// Decision actions.
const (
	Start   Action = "start"    // the initial limit
	Raise   Action = "raise"    // room at the server and the limit in use
	Hold    Action = "hold"     // nothing says more would help, nothing says less
	BackOff Action = "back off" // pressure
	Ceiling Action = "ceiling"  // a crash under pressure lowered the ceiling
	Shed    Action = "shed"     // requests cancelled to bring KV usage down before it crashes the server
)

func (d Decision) String() string {
	if d.From == d.To {
		return fmt.Sprintf("%s at %d: %s", d.Action, d.To, d.Reason)
	}
	return fmt.Sprintf("%s %d -> %d: %s", d.Action, d.From, d.To, d.Reason)
}

// Params tune the controller. DefaultParams holds the values measured with
// the sweep tool (bench/sweep); tests use them too.
type Params struct {
	// The queue band, in requests waiting at the server: a share of the
	// requests running, with a floor. Below QueueLow the server has room;
	// above QueueHigh the excess is taken off the limit.
	QueueLow, QueueLowMin   float64
	QueueHigh, QueueHighMin float64
	// CacheQueueLow and CacheQueueHigh replace QueueLow and QueueHigh
	// while the lane's requests reuse a cached prefix (Sample.Reuse).
	CacheQueueLow, CacheQueueHigh float64
	// RetractBurst is the share of running requests retracted in one
	// interval (at least RetractBurstMin) that counts as a burst.
	RetractBurst    float64
	RetractBurstMin float64
	// KVHigh is the KV usage that counts as pinned when it holds for
	// KVPinned samples in a row.
	KVHigh   float64
	KVPinned int
	// TTFTSpike: a short-run average TTFT this many times the long-run
	// one is pressure (the server fell behind), as in Netflix's Gradient2.
	TTFTSpike float64
	// BackOff multiplies the limit on a burst, pinned KV, a TTFT spike or
	// errors; Cooldown samples follow without a raise.
	BackOff  float64
	Cooldown int
	// SlowStartKV ends slow start at this KV usage even while the queue
	// is below the band: a request's KV grows as it decodes, so the queue
	// shows a full pool one or two probes after the tripling that
	// overfilled it.
	SlowStartKV float64
	// Growth is the share added per interval once out of slow start (at
	// least one request); EmptyGrowth while the server's queue is empty,
	// FastGrowth while it is empty and KV usage is below RoomKV.
	Growth, EmptyGrowth, FastGrowth, RoomKV float64
	// Plateau: a raise that bought less than this share of its relative
	// size in goodput, twice in a row, holds the limit for PlateauHold
	// samples before probing again.
	Plateau     float64
	PlateauHold int
	// After a crash under pressure: the ceiling is CrashCeiling times the
	// endpoint's load at the crash; KV usage above CrashKV, or CrashMargin
	// below the level the server crashed at if that is lower, then backs
	// off at once.
	CrashCeiling float64
	CrashKV      float64
	CrashMargin  float64
	// CrashRoom: after such a crash the limit is raised only while KV
	// usage is this far below the back-off level (a request's KV grows
	// for minutes after the raise that admitted it).
	CrashRoom float64
}

// slotQueueHigh: the most requests a slot-bound server may keep waiting
// before the limit is cut (one covers the gap between a slot freeing and
// the next request arriving).
const slotQueueHigh = 1

// slowStartGain multiplies the limit per probe in slow start.
const slowStartGain = 3

// DefaultParams are the defaults; see the package documentation for why.
var DefaultParams = Params{
	QueueLow: 0.5, QueueLowMin: 4,
	QueueHigh: 1.5, QueueHighMin: 12,
	CacheQueueLow: 0.1, CacheQueueHigh: 0.3,
	RetractBurst: 0.1, RetractBurstMin: 5,
	KVHigh: 0.99, KVPinned: 3,
	TTFTSpike: 2.5,
	BackOff:   0.8, Cooldown: 2,
	SlowStartKV: 0.5,
	Growth:      0.05, EmptyGrowth: 0.25, FastGrowth: 0.5, RoomKV: 0.7,
	Plateau: 0.2, PlateauHold: 12,
	CrashCeiling: 0.75, CrashKV: 0.9, CrashMargin: 0.05, CrashRoom: 0.1,
}

// Controller is the adaptive limit of one lane on one endpoint. It is a
// pure function of the samples it is fed: no clock, no goroutine, no lock
// (the dispatcher serialises calls).
type Controller struct {
	p      Params
	b      Bounds
	limit  float64
	ceil   float64 // lowered by crashes; +Inf until one
	kvHigh float64
	pinN   int // samples in a row KV usage must hold above kvHigh

	slowStart bool
	pinned    int // consecutive samples above kvHigh
	cooldown  int
	// TTFT averages in seconds, short and long run, and samples seen.
	ttftShort, ttftLong float64
	ttftN               int
	goodAvg             float64 // tokens/s, running average
	// The last raise, to see whether it bought goodput, and the server's
	// running requests when it was made.
	raisedFrom, raisedGood, raisedRunning float64
	flat, plateau                         int
	crashes                               int
	// slots caps the limit for a slot-bound server (0 = none): past its
	// slots a request only waits (Sample.Slots).
	slots float64

	last, moved Decision
}

// New returns a controller at b.Initial (clamped into the bounds).
func New(b Bounds, p Params, now time.Time) *Controller {
	b.Min = max(b.Min, 1)
	if b.Max > 0 && b.Max < b.Min {
		b.Max = b.Min
	}
	c := &Controller{p: p, b: b, ceil: math.Inf(1), kvHigh: p.KVHigh, pinN: max(p.KVPinned, 1), slowStart: true}
	c.limit = c.clamp(float64(b.Initial))
	c.last = Decision{Time: now, From: c.Limit(), To: c.Limit(), Action: Start, Reason: fmt.Sprintf("initial limit %d", c.Limit())}
	c.moved = c.last
	return c
}

// Limit is the current limit.
func (c *Controller) Limit() int { return int(math.Floor(c.limit)) }

// CrashKV is the KV usage a crash under pressure made the back-off level,
// 0 before one.
func (c *Controller) CrashKV() float64 {
	if c.crashes == 0 {
		return 0
	}
	return c.kvHigh
}

// Ceiling is the cap set by crashes, 0 when there is none.
func (c *Controller) Ceiling() int {
	if math.IsInf(c.ceil, 1) {
		return 0
	}
	return int(c.ceil)
}

// Last is the latest decision.
func (c *Controller) Last() Decision { return c.last }

// Moved is the latest decision that changed the limit.
func (c *Controller) Moved() Decision { return c.moved }

func (c *Controller) record(d Decision) Decision {
	c.last = d
	if d.To != d.From || d.Action == Ceiling || d.Action == Shed {
		c.moved = d
	}
	return d
}

func (c *Controller) clamp(v float64) float64 {
	v = math.Min(v, c.ceil)
	if c.slots > 0 {
		v = math.Min(v, c.slots)
	}
	if c.b.Max > 0 {
		v = math.Min(v, float64(c.b.Max))
	}
	return math.Max(v, float64(c.b.Min))
}

// Update feeds one interval's sample and returns the decision it led to.
func (c *Controller) Update(s Sample) Decision {
	from := c.Limit()
	ev := evidence{}
	action, reason := c.decide(s, &ev)
	d := Decision{Time: s.Time, From: from, To: c.Limit(), Action: action, Reason: reason + ev.String()}
	if d.To == d.From && action != Hold && action != BackOff {
		d.Action = Hold // a raise or cut the bounds swallowed
	}
	return c.record(d)
}

func (c *Controller) decide(s Sample, ev *evidence) (Action, string) {
	running := math.Max(s.Running, 0)
	low, high := c.p.QueueLow, c.p.QueueHigh
	if s.Reuse {
		low, high = c.p.CacheQueueLow, c.p.CacheQueueHigh
	}
	qLow := math.Max(c.p.QueueLowMin, low*running)
	qHigh := math.Max(c.p.QueueHighMin, high*running)
	if s.Slots > 0 {
		// A slot-bound server: the slots are the whole capacity and a
		// waiting request only waits, so the target is the slot count
		// with a queue near zero, not a generation of work waiting.
		c.slots = math.Max(s.Slots, float64(c.b.Min))
		qLow, qHigh = 0, slotQueueHigh
		c.limit = c.clamp(c.limit)
	}
	spike := c.track(s, qLow, qHigh, ev)
	// A cut takes effect as requests finish; until the lane is back
	// within its limit another cut would only count the same pressure twice.
	settled := s.InFlight <= c.Limit()

	if why := c.pressure(s, running, spike); why != "" {
		if !settled {
			return Hold, why + ", waiting for the last cut to take effect"
		}
		return c.backOff(why)
	}
	if s.Queued > qHigh {
		c.slowStart = false
		if !settled {
			return Hold, "queue above the band, waiting for the last cut to take effect"
		}
		return c.cutToBand(s, qLow, qHigh)
	}
	if c.cooldown > 0 {
		c.cooldown--
		return Hold, "cooling down after a back-off"
	}
	if c.plateau > 0 {
		c.plateau--
		return Hold, "goodput stopped rising with the limit"
	}
	roomy := s.Queued >= 0 && s.Queued <= qLow
	if s.Queued < 0 {
		// No queue gauge: a calm time to first token is the room signal.
		roomy = s.TTFT > 0 && !spike
	}
	used := float64(max(s.Peak, s.InFlight)) >= math.Max(c.limit-math.Max(1, 0.1*c.limit), 1)
	crowded := !roomy && c.crowdedOut(s, qLow)
	switch {
	case !roomy && !crowded:
		c.slowStart = false
		return Hold, "queue in the band"
	case !used:
		return Hold, "limit not in use"
	case c.crashes > 0 && s.KVUsage >= c.kvHigh-c.p.CrashRoom:
		return Hold, fmt.Sprintf("KV usage at or above %.2f on a server that crashed under pressure", c.kvHigh-c.p.CrashRoom)
	case crowded:
		c.slowStart = false
		c.limit = c.clamp(c.limit + math.Max(1, c.p.Growth*c.limit))
		return Raise, "the queue in the band is other lanes' requests"
	}
	return c.raise(s)
}

// crowdedOut reports that the server's queue is in the band with this
// lane's own requests below their share of it (its share of the
// endpoint's requests in flight), while the endpoint's other lanes have
// requests waiting: the queue the band holds is theirs. Held there, a
// lane cut low (a shed, a cut to the band) stays low for the rest of the
// job while its work waits at the client, not at the server: on
// bench/sweep's kv231k the long lane, cut to 7 by a shed, held the
// escalations of truncated answers (the job's longest chains) back.
func (c *Controller) crowdedOut(s Sample, qLow float64) bool {
	if s.OthersWaiting <= 0 || s.EndpointInFlight <= 0 || s.Queued < 0 {
		return false
	}
	share := float64(s.InFlight) / float64(s.EndpointInFlight)
	return float64(s.Waiting) < share*qLow
}

// track writes the sample's evidence and folds it into the running state
// (TTFT averages, goodput, how long KV usage has been pinned); it reports
// whether time to first token spiked.
func (c *Controller) track(s Sample, qLow, qHigh float64, ev *evidence) (spike bool) {
	if s.Queued >= 0 {
		ev.add("queue %.0f (band %.0f-%.0f)", s.Queued, qLow, qHigh)
	}
	if s.KVUsage >= 0 {
		ev.add("kv %.2f", s.KVUsage)
	}
	if s.Retractions > 0 {
		ev.add("retracted %.0f", s.Retractions)
	}
	if s.Errors > 0 {
		ev.add("%d errors", s.Errors)
	}
	ev.add("in flight %d/%d", s.InFlight, c.Limit())
	if s.OthersWaiting > 0 {
		ev.add("waiting %d, other lanes %d", s.Waiting, s.OthersWaiting)
	}

	// TTFT: short- against long-run average, judged before this sample
	// joins them, and only once both have history.
	ttft := s.TTFT.Seconds()
	if ttft > 0 {
		c.ttftN++
		c.ttftShort = ewma(c.ttftShort, ttft, 0.5)
		spike = c.ttftN > 3 && c.ttftShort > c.p.TTFTSpike*c.ttftLong
		if spike {
			ev.add("ttft %.2fs, long-run %.2fs", c.ttftShort, c.ttftLong)
		}
		c.ttftLong = ewma(c.ttftLong, ttft, 0.1)
	}
	c.plateauCheck(s.Goodput, s.Running)
	if s.Goodput >= 0 {
		c.goodAvg = ewma(c.goodAvg, s.Goodput, 0.5)
	}
	if s.KVUsage >= c.kvHigh {
		c.pinned++
	} else {
		c.pinned = 0
	}
	return spike
}

// pressure is why the sample calls for a multiplicative decrease, as AIMD
// does on loss, or "" when nothing does.
func (c *Controller) pressure(s Sample, running float64, spike bool) string {
	switch {
	case s.Errors > 0:
		return "errors from the server"
	case s.Retractions >= math.Max(c.p.RetractBurstMin, c.p.RetractBurst*running):
		return "retraction burst"
	case c.pinned >= c.pinN:
		return fmt.Sprintf("KV usage at or above %.2f for %d samples", c.kvHigh, c.pinned)
	case spike && s.Queued < 0:
		// With a queue gauge the queue itself says more than its wait.
		return "time to first token rising"
	}
	return ""
}

// cutToBand takes the server's queue excess over the band's middle (this
// lane's share of it) off what is in flight now: the queue measured
// rather than inferred from RTTs as Vegas does.
func (c *Controller) cutToBand(s Sample, qLow, qHigh float64) (Action, string) {
	share := 1.0
	if s.EndpointInFlight > 0 {
		share = float64(s.InFlight) / float64(s.EndpointInFlight)
	}
	target := (qLow + qHigh) / 2
	want := float64(s.InFlight) - math.Max(share*(s.Queued-target), 1)
	c.limit = c.clamp(math.Max(math.Min(c.limit, want), c.limit*0.7))
	c.cooldown = max(c.cooldown, 1)
	return BackOff, "queue above the band"
}

// raise grows a limit the lane fills on a server with room: tripled in
// slow start (until KV usage reaches SlowStartKV), by a quarter or a half
// while the queue is empty, else by Growth.
func (c *Controller) raise(s Sample) (Action, string) {
	p := c.p
	// A limit cut below what runs without a queue was cut too deep.
	c.limit = math.Max(c.limit, c.clamp(float64(s.InFlight)))
	c.raisedFrom, c.raisedGood, c.raisedRunning = c.limit, c.goodAvg, s.Running
	switch {
	case c.slowStart && p.SlowStartKV > 0 && s.KVUsage >= p.SlowStartKV:
		c.slowStart = false
		c.limit = c.clamp(c.limit + math.Max(1, p.Growth*c.limit))
		return Raise, fmt.Sprintf("slow start ends at KV usage %.2f", s.KVUsage)
	case c.slowStart:
		c.limit = c.clamp(c.limit * slowStartGain)
		return Raise, "slow start"
	case s.Queued == 0 && s.KVUsage >= 0 && s.KVUsage < p.RoomKV && c.kvHigh >= p.KVHigh:
		c.limit = c.clamp(c.limit * (1 + p.FastGrowth))
		return Raise, "empty queue, KV room"
	case s.Queued == 0 && c.kvHigh >= p.KVHigh:
		c.limit = c.clamp(c.limit * (1 + p.EmptyGrowth))
		return Raise, "empty queue"
	case c.crashes > 0 && s.Queued == 0 && s.KVUsage >= 0 && s.KVUsage < c.kvHigh-p.CrashRoom-crashRoomMargin:
		// After a crash: a trough of the saw, far below the level it
		// crashed at; climbing out a request at a time wastes it.
		c.limit = c.clamp(c.limit * (1 + p.EmptyGrowth))
		return Raise, "empty queue, KV room"
	default:
		c.limit = c.clamp(c.limit + math.Max(1, p.Growth*c.limit))
		return Raise, "room at the server"
	}
}

// plateauCheck compares the goodput of the interval after a raise with
// the goodput before it. Only raises of at least a fifth are judged (a
// few percent drowns in noise), and only when the server's batch did not
// shrink meanwhile: when its running requests fell, those finishing
// outnumbered those the raise added (a job's tail), and goodput fell with
// the batch whatever the limit. Two flat ones in a row start a hold.
func (c *Controller) plateauCheck(good, running float64) {
	if c.raisedFrom <= 0 {
		return
	}
	rel := c.limit/c.raisedFrom - 1
	gain := good/c.raisedGood - 1
	c.raisedFrom = 0
	if rel < 0.2 || good < 0 || c.raisedGood <= 0 {
		return
	}
	if running >= 0 && c.raisedRunning >= 0 && running < c.raisedRunning {
		return
	}
	if gain < c.p.Plateau*rel {
		c.flat++
	} else {
		c.flat = 0
	}
	if c.flat >= 2 {
		c.flat = 0
		c.plateau = c.p.PlateauHold
		c.slowStart = false
	}
}

func (c *Controller) backOff(why string) (Action, string) {
	c.slowStart = false
	c.limit = c.clamp(c.limit * c.p.BackOff)
	c.cooldown = c.p.Cooldown
	return BackOff, why
}

// Crashed records that the endpoint crashed under pressure (an out-of-memory
// crash after KV usage stayed high): the ceiling drops to CrashCeiling times
// the load that crashed it, and KV usage above CrashKV (or CrashMargin
// below kv, the level the server crashed at, 0 = unknown) backs off at
// once from now on. inFlight is the endpoint's peak over all lanes in the last
// interval before the crash (0 = unknown: the lane's limit stands in): the
// server crashed under all of it, so every lane may use up to the ceiling
// and the dispatcher holds their sum to it. A lane's own share would starve
// the lane that had few requests in flight when the crash came (a long
// lane the controller had just cut), and it is the sum that fills the pool.
// why is the evidence.
func (c *Controller) Crashed(now time.Time, inFlight int, kv float64, why string) Decision {
	from := c.Limit()
	base := c.limit
	if inFlight > 0 {
		base = float64(inFlight)
	}
	c.crashes++
	c.ceil = math.Max(math.Floor(c.p.CrashCeiling*base), c.crashFloor())
	c.limit = c.clamp(c.limit)
	c.kvHigh = math.Min(c.kvHigh, c.p.CrashKV)
	if kv > 0 {
		c.kvHigh = math.Max(math.Min(c.kvHigh, kv-c.p.CrashMargin), crashKVFloor)
	}
	c.pinN = 1
	c.slowStart = false
	c.cooldown = c.p.Cooldown
	return c.record(Decision{Time: now, From: from, To: c.Limit(), Action: Ceiling,
		Reason: fmt.Sprintf("crash %d under pressure (%s): ceiling %d, back off above KV usage %.2f", c.crashes, why, c.Ceiling(), c.kvHigh)})
}

// Shed records that the dispatcher cancelled requests of this lane on its
// endpoint to bring KV usage down (pinned at the top, or near the level a
// crash came at): the limit drops to what the lane has left in flight, so
// the slots freed are not filled again at once, and the usual cooldown
// follows. why is the evidence.
func (c *Controller) Shed(now time.Time, left int, why string) Decision {
	from := c.Limit()
	c.limit = c.clamp(math.Min(c.limit, float64(left)))
	c.slowStart = false
	c.cooldown = c.p.Cooldown
	return c.record(Decision{Time: now, From: from, To: c.Limit(), Action: Shed, Reason: why})
}

// Backpressure records that the server asked for less load (HTTP 429, or
// 503 with Retry-After) with inFlight of this lane's requests in flight:
// the limit backs off from what was in flight (never above the limit),
// and the usual cooldown follows. why is the evidence.
func (c *Controller) Backpressure(now time.Time, inFlight int, why string) Decision {
	from := c.Limit()
	c.limit = c.clamp(math.Min(c.limit, float64(max(inFlight, 1))) * c.p.BackOff)
	c.slowStart = false
	c.cooldown = c.p.Cooldown
	return c.record(Decision{Time: now, From: from, To: c.Limit(), Action: BackOff, Reason: why})
}

// crashFloor is the lowest ceiling a crash sets: the lane's starting limit
// (at most crashFloorMax) or its minimum, if higher. A lane with fewer
// requests in flight than that when the server crashed (a long lane of a
// few escalations beside a busy short one) did not fill the server, and a
// ceiling of one or two would run its work one request at a time.
func (c *Controller) crashFloor() float64 {
	return math.Max(float64(c.b.Min), math.Min(float64(c.b.Initial), crashFloorMax))
}

// crashKVFloor is the lowest back-off level a crash sets: below it a
// server is not crashing for its KV usage.
const crashKVFloor = 0.5

// crashRoomMargin: after a crash, KV usage this far below where raises
// stop raises the limit by EmptyGrowth rather than by Growth.
const crashRoomMargin = 0.2

// crashFloorMax caps crashFloor for a lane started high.
const crashFloorMax = 4

// Rescale follows a change of the endpoint's KV pool (a server restarted
// with another size): the limit and ceiling scale with it.
func (c *Controller) Rescale(now time.Time, oldTokens, newTokens float64) Decision {
	if oldTokens <= 0 || newTokens <= 0 || oldTokens == newTokens {
		return c.last
	}
	from := c.Limit()
	f := newTokens / oldTokens
	if !math.IsInf(c.ceil, 1) {
		c.ceil = math.Max(math.Floor(c.ceil*f), float64(c.b.Min))
	}
	c.limit = c.clamp(c.limit * f)
	act := Raise
	if f < 1 {
		act = BackOff
	}
	return c.record(Decision{Time: now, From: from, To: c.Limit(), Action: act,
		Reason: fmt.Sprintf("KV pool changed from %.0f to %.0f tokens", oldTokens, newTokens)})
}

func ewma(avg, v, a float64) float64 {
	if avg == 0 {
		return v
	}
	return a*v + (1-a)*avg
}

// evidence collects the figures a decision rests on.
type evidence struct{ parts []string }

func (e *evidence) add(format string, args ...any) {
	e.parts = append(e.parts, fmt.Sprintf(format, args...))
}

func (e evidence) String() string {
	if len(e.parts) == 0 {
		return ""
	}
	return " (" + strings.Join(e.parts, ", ") + ")"
}
