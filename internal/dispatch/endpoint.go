package dispatch

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
)

// endpoint is one server URL with its balancing and breaker state. Fields
// without a comment are guarded by Dispatcher.mu; the token counters are
// atomics because onDelta runs for every streamed chunk.
type endpoint struct {
	url    string
	client Chatter
	server atomic.Pointer[Server] // what the server reports itself to be (SetServer); nil until known

	inflight    int
	busySince   time.Time // when inflight last went from 0 to 1
	calls       map[*call]struct{}
	paused      bool
	resumed     bool // Resume was called once (startHoldLocked)
	pauseReason string
	requests    int64
	errors      map[llm.Class]int64
	lastDown    string // the last server-down error, evidence for an open breaker

	// Whose fault a server-down error is (fault.go): the last two samples
	// that failed so, the last pause and the last answer.
	downs    [2]downMark
	downNews chan struct{} // closed at the next down mark or pause (settleCutLocked)
	pausedAt time.Time
	servedAt time.Time
	// Backpressure (fault.go): no new request before holdUntil; pressN
	// counts backpressure holds in a row; fixedCap caps the fixed lanes'
	// requests in flight here (0 = none).
	holdUntil time.Time
	pressN    int
	fixedCap  int
	// holdSince and holdReason are the last hold's start and the answer
	// that began it, for the views.
	holdSince  time.Time
	holdReason string
	// The burn guard (burn.go): the run of server errors since the last
	// answer, the start of the latest request answered, and since when the
	// endpoint is broken (zero: it is not) after how many samples in a row.
	streak        burnStreak
	okStart       time.Time
	brokenSince   time.Time
	brokenSamples int

	// Breaker: closed when openUntil is zero; open until openUntil; after
	// that half-open, letting one probe request through.
	openUntil time.Time
	opens     int  // consecutive openings, for the cooldown doubling
	probing   bool // the half-open probe is in flight

	lanes []epLane // per lane, indexed like Dispatcher.lanes
	// ceiling caps the requests in flight over all lanes once a crash
	// under pressure set one for the auto lanes (0 = none); crashKV is the
	// KV usage its auto lanes back off at since.
	ceiling int
	crashKV float64
	load    load
	warm    warmSet // its held conversations (admit.go)

	// perChunk is the completion tokens per streamed chunk of its answers
	// (a server's --stream-interval puts several in one), 0 until one
	// answered; chunks times it estimates a running request's tokens.
	perChunk float64

	lastToken  atomic.Int64 // unix nanoseconds of the last onDelta
	tokens     atomic.Int64
	completion atomic.Int64 // completion tokens of the answers received (usage)
	// streamed counts tokens as they arrive (chunks times perChunkBits),
	// topped up to each answer's usage when it completes: the views' rate,
	// steady while 12,000-token answers stream, not credited at their end.
	streamed     atomic.Int64
	perChunkBits atomic.Uint64 // math.Float64bits(perChunk), read without Dispatcher.mu
}

// call is one request in flight.
type call struct {
	ep      *endpoint
	probe   bool // sent through a half-open breaker
	cancel  context.CancelCauseFunc
	lane    *lane
	start   time.Time
	tokens0 int64   // the endpoint's token count when it started
	est     float64 // its estimated KV footprint in tokens
	prompt  float64 // its prompt estimate in tokens
	// streaming is set at the first streamed chunk: before it the request
	// is waiting in the server's queue (or in its prefill).
	streaming atomic.Bool
	generated atomic.Int64 // chunks streamed so far (tokensLocked estimates its tokens)
	credited  int64        // tokens added to ep.streamed for it (its stream's goroutine only)
	shed      bool         // cancelled to relieve KV pressure (guarded by Dispatcher.mu)
	moved     bool         // cancelled to go to a server with room (guarded by Dispatcher.mu)
	// noProgress: the stream was cut for bytes without a token
	// (llm.ErrNoProgress); set by send, read by settle in the same goroutine.
	noProgress bool
	backup     bool // a backup in an escalation lane (hedge.go)
	over       bool // a next turn sent back to its endpoint over the limit (affinity.go)
	// later: a conversation's turn after its first (its priority, admit.go);
	// routingKey: the conversation's id, sent as a session hint.
	later      bool
	routingKey string
	held       *heldConv // the conversation's hold this turn started (admit.go), nil when none
	// hist is what the conversation's turn before kept (history.go), nil
	// when nothing fits the claim.
	hist *convHistory
	// plan is the sample's body decoded at the claim, when hist is nil.
	plan *conversation.Plan
	// hedge is the backup started for it (hedge.go), guarded by
	// Dispatcher.mu; it is never unset.
	hedge *hedge
}

// tokensLocked estimates the tokens c generated so far; Dispatcher.mu
// must be held.
func (c *call) tokensLocked() float64 {
	return float64(c.generated.Load()) * c.ep.tokensPerChunkLocked()
}

// tokensPerChunkLocked is e.perChunk, 1 while unknown.
func (e *endpoint) tokensPerChunkLocked() float64 {
	if e.perChunk <= 0 {
		return 1
	}
	return e.perChunk
}

// learnChunkLocked updates e.perChunk from an answer of completion tokens
// streamed in chunks.
func (e *endpoint) learnChunkLocked(completion int, chunks int64) {
	if completion <= 0 || chunks <= 0 {
		return
	}
	r := float64(completion) / float64(chunks)
	if e.perChunk <= 0 {
		e.perChunk = r
	} else {
		e.perChunk += (r - e.perChunk) / 8
	}
	e.perChunkBits.Store(math.Float64bits(e.perChunk))
}

// streamChunks credits e.streamed with the tokens of cl's chunks so far
// (chunks of them), at the endpoint's tokens per chunk.
func (e *endpoint) streamChunks(cl *call, chunks int64) {
	per := math.Float64frombits(e.perChunkBits.Load())
	if per <= 0 {
		per = 1
	}
	if n := int64(float64(chunks)*per) - cl.credited; n > 0 {
		cl.credited += n
		e.streamed.Add(n)
	}
}

// streamDone tops e.streamed up to the usage of cl's answer: chunks
// undercount a server that puts several tokens in one.
func (e *endpoint) streamDone(cl *call, completion int) {
	if n := int64(completion) - cl.credited; n > 0 {
		cl.credited += n
		e.streamed.Add(n)
	}
}

func (e *endpoint) breakerClosed() bool { return e.openUntil.IsZero() }

// available reports whether a new request may be sent to e now.
func (e *endpoint) available(now time.Time) bool {
	if e.paused || now.Before(e.holdUntil) {
		return false
	}
	return e.breakerClosed() || (!now.Before(e.openUntil) && !e.probing)
}

// capacity is how many new requests e accepts now: a closed breaker takes
// any number (the lane limits bound them), a half-open one a single probe.
func (e *endpoint) capacity(now time.Time) int {
	switch {
	case !e.available(now):
		return 0
	case e.breakerClosed():
		return maxClaim
	default:
		return 1
	}
}

func (e *endpoint) breakerState(now time.Time) string {
	switch {
	case e.breakerClosed():
		return "closed"
	case now.Before(e.openUntil):
		return "open"
	default:
		return "half-open"
	}
}

// tripBreaker records a server-down failure of c and reports whether it
// opened (or reopened) the breaker.
func (e *endpoint) tripBreaker(c *call, now time.Time, first time.Duration) bool {
	if c.probe {
		e.probing = false
	} else if !e.breakerClosed() {
		// A request sent before the breaker opened; the opening already
		// accounts for this outage.
		return false
	}
	e.opens++
	e.openUntil = now.Add(breakerCooldown(e.opens, first))
	return true
}

// closeBreaker records that the server answered and reports whether the
// breaker was open.
func (e *endpoint) closeBreaker() bool {
	was := !e.breakerClosed()
	e.openUntil = time.Time{}
	e.opens = 0
	e.probing = false
	return was
}
