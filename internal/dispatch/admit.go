package dispatch

import (
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// Conversation-level admission.
//
// Affinity sends a conversation's next turn back to the endpoint that
// answered the turn before, but its history is still cached there only if
// the pool kept it: with more conversations active on an endpoint than its
// KV pool holds, the server evicts the histories of those between turns
// (least recently used first) and each next turn prefills its whole
// conversation again, whatever the routing (issue 32: a working set
// several times the four pools gave a 72% hit rate with affinity against
// 66% without). So each endpoint holds at most as many active
// conversations as its pool keeps warm:
//
//   - a conversation (a sample whose plan has more than one turn) is held
//     by the endpoint its turn was sent to, from the start of its first
//     turn until its last turn is answered, it fails or is given back,
//     a claim shows another worker took its next turn (dropTakenLocked),
//     or it waited heldIdle for its next turn;
//   - its warm footprint is its context: while a turn runs, the turn's
//     prompt and the lane's mean answer (the request's estimate), and
//     between turns the prompt and answer of the last one as the server
//     counted them; its shared prefix (system prompt and tools) counts once
//     per endpoint however many held conversations share it;
//   - a new conversation's first turn goes only to an endpoint where the
//     held conversations and it stay within warmShare of the pool at their
//     peak in the turns to come (peakWith, admits): each grows at the rate
//     it grew so far, one turn at a time, until its last turn; an endpoint
//     holding none takes one whatever its size, and one whose pool is not
//     known yet takes blindConvs. Counted instead at its size after its
//     last turn (until December 2026), a conversation counted at twice what
//     it holds on average, and the feedback scale that made up for it
//     swung the conversations held on an mtlong endpoint between 16 and 64;
//   - a held conversation's next turn is never refused: the pool was kept
//     for it. The store hands next turns out before first turns, and a
//     server that schedules by priority is told so (Server.Priority);
//   - and it goes nowhere else (pinnedLocked): it waits for room on the
//     endpoint of the turn before, however loaded, unless that endpoint is
//     paused (down, draining) or its breaker is not closed. Affinity alone
//     moves a turn off a clearly more loaded or full endpoint, and under
//     admission that was 15% of later turns on mtlong (same ep 85%), each
//     prefilling a history of 5-9k tokens again and leaving the old copy
//     cached, dead, on the endpoint it left.
//
// While no endpoint admits a new conversation, the claim loop asks the
// store for no more samples than held conversations wait for their next
// turn (claimCapLocked), so refused first turns are not claimed and given
// back in a loop; the first conversation to leave lifts that.
//
// Several workers sharing one store (PostgreSQL) and the same servers each
// keep this state for their own conversations only, so each would admit up
// to the whole pool: three workers held 24 conversations at once where one
// worker alone held 10 against the same server (TestSharedWorkersHoldOnePool
// in internal/runner) and thrashed its cache. So each worker counts against
// its part of the pool: pool / the live workers sending to the endpoint
// (SetSharers; the runner reads the count from the workers' heartbeats,
// crew.Sharers). An equal part needs no traffic between workers and holds
// from the first claim: counting the others' held tokens from their
// heartbeats instead would let workers starting together each see an empty
// pool and fill it, and the server's own KV usage cannot tell a held
// history from a stale one its cache keeps until it needs the room. A
// worker that holds less than its part leaves the rest unused; a worker
// that dies stops counting once its heartbeat is dead_after old. Alone, a
// worker's admission is unchanged.

// warmShare is the part of an endpoint's KV pool its held conversations
// may fill; the rest is the headroom running requests grow into (a turn's
// answer is estimated at the lane's mean, and some run longer). Counted
// at their peak ahead, 0.9 left the mtlong servers at KV 0.78, saturated
// 9% of the time: 4,210 tokens/s (4,168-4,279) against 4,456 (4,256-4,482)
// at 0.95, later turns' hit 94% either way (bench/sweep/README.md).
const warmShare = 0.95

// heldIdle is how long a held conversation may wait for its next turn
// before it is dropped: its next turn never came back, or was taken by
// another worker sharing the store in a way no claim here showed (its
// lane not served here, or every claim full of other next turns).
const heldIdle = 2 * time.Minute

// blindConvs is how many conversations an endpoint whose pool is not known
// yet holds: the first claims come before the first probe, and a job
// that started every conversation then would fill the pools several times
// over with histories that all grow together.
const blindConvs = 8

// admits reports whether an endpoint with a KV pool of pool tokens (0 =
// unknown), holding convs conversations, takes a new one when they and it
// would hold peak tokens at most at once in the turns to come
// (warmSet.peakWith).
func admits(pool, peak float64, convs int) bool {
	switch {
	case convs == 0:
		return true
	case pool <= 0:
		return convs < blindConvs
	}
	return peak <= warmShare*pool
}

// admitsShare is admits for one of sharers workers sending to the
// endpoint: each counts against its part of the pool (and of blindConvs).
func admitsShare(pool, peak float64, convs, sharers int) bool {
	if sharers <= 1 {
		return admits(pool, peak, convs)
	}
	if pool <= 0 && convs > 0 {
		return convs < max(blindConvs/sharers, 1)
	}
	return admits(pool/float64(sharers), peak, convs)
}

// warmSet is one endpoint's held conversations' footprint (guarded by
// Dispatcher.mu).
type warmSet struct {
	tokens   float64        // own tokens of every held conversation, and each shared prefix once
	shared   float64        // the shared prefixes' part of tokens
	convs    int            // conversations held
	prefixes map[uint64]int // held conversations per shared prefix
	held     map[*heldConv]struct{}
	// ahead[k] is what the held conversations hold k turns from now
	// (aheadTokens), nil when a hold changed since it was counted.
	ahead []float64
	// scale multiplies the pool admission counts against (0 = 1), moved by
	// what next turns sent back here found cached (judge); reported: the
	// server reports cached tokens at all (one answer said some).
	scale        float64
	reported     bool
	judged, lost int
	// sharers is how many live workers send to the endpoint, this one
	// included (SetSharers; 0 = this one alone).
	sharers int
}

// Feedback on the warm share. The peak ahead is an estimate (a turn's
// answer counts at the lane's mean, and the server reserves room for
// longer ones). Every judgeWindow next turns sent back to the endpoint of
// the turn before, the share of them that did not find at least keptShare
// of their previous prompt cached moves the scale: more than lostShare
// lowers it by scaleDown (to at least minScale), none lost raises it by
// scaleUp (to at most maxScale). A server that reports no cached tokens
// leaves it at 1.
const (
	judgeWindow = 32
	keptShare   = 0.9
	lostShare   = 0.05
	scaleUp     = 1.1
	scaleDown   = 0.9
	minScale    = 0.5
	// maxScale and startScale: the pool as it is. The peak ahead
	// (warmSet.peakWith) is what the conversations will hold, not a bound
	// above it: raised past the pool, the scale let in conversations
	// whose histories queued and were evicted, then fell for a window of
	// losses, and held conversations swung between 16 and 64 an endpoint.
	maxScale   = 1
	startScale = 1
)

func (w *warmSet) scaleOr1() float64 {
	if w.scale == 0 {
		return startScale
	}
	return w.scale
}

// judge counts a next turn sent back here, kept when its history was
// found cached, and moves the scale at the end of a window.
func (w *warmSet) judge(kept bool) {
	w.judged++
	if !kept {
		w.lost++
	}
	if w.judged < judgeWindow {
		return
	}
	switch {
	case w.lost == 0:
		w.scale = min(w.scaleOr1()*scaleUp, maxScale)
	case float64(w.lost) > lostShare*float64(w.judged):
		w.scale = max(w.scaleOr1()*scaleDown, minScale)
	}
	w.judged, w.lost = 0, 0
}

// need is what a conversation of own tokens beyond its shared prefix
// (prefixTok tokens, key prefix) adds to w.
func (w *warmSet) need(own float64, prefix uint64, prefixTok float64) float64 {
	if prefix != 0 && w.prefixes[prefix] > 0 {
		return own
	}
	return own + prefixTok
}

func (w *warmSet) add(h *heldConv) {
	w.tokens += h.own
	w.convs++
	if w.held == nil {
		w.held = map[*heldConv]struct{}{}
	}
	w.held[h], w.ahead = struct{}{}, nil
	if h.prefix == 0 {
		w.tokens += h.prefixTok
		w.shared += h.prefixTok
		return
	}
	if w.prefixes == nil {
		w.prefixes = map[uint64]int{}
	}
	if w.prefixes[h.prefix] == 0 {
		w.tokens += h.prefixTok
		w.shared += h.prefixTok
	}
	w.prefixes[h.prefix]++
}

func (w *warmSet) remove(h *heldConv) {
	w.tokens = max(w.tokens-h.own, 0)
	w.convs--
	delete(w.held, h)
	w.ahead = nil
	if h.prefix == 0 {
		w.tokens = max(w.tokens-h.prefixTok, 0)
		w.shared = max(w.shared-h.prefixTok, 0)
		return
	}
	if w.prefixes[h.prefix]--; w.prefixes[h.prefix] <= 0 {
		delete(w.prefixes, h.prefix)
		w.tokens = max(w.tokens-h.prefixTok, 0)
		w.shared = max(w.shared-h.prefixTok, 0)
	}
}

// ownAhead is a conversation's own context k turns from now, own tokens
// after done of its turns: it grows at the rate it grew so far, and is
// gone once its last turn is answered.
func ownAhead(own float64, done, turns, k int) float64 {
	switch {
	case k > max(turns-done, 0):
		return 0
	case done <= 0:
		return own
	}
	return own * float64(done+k) / float64(done)
}

// aheadTokens is w.ahead, counted again when a hold changed: what the held
// conversations' own contexts and their shared prefixes come to k turns
// from now, for every k until the last of them ends.
func (w *warmSet) aheadTokens() []float64 {
	if w.ahead != nil {
		return w.ahead
	}
	last := 0
	for h := range w.held {
		last = max(last, h.turns-h.done)
	}
	w.ahead = make([]float64, last+1)
	for k := range w.ahead {
		w.ahead[k] = w.shared
	}
	for h := range w.held {
		for k := range max(h.turns-h.done, 0) + 1 {
			w.ahead[k] += ownAhead(h.own, h.done, h.turns, k)
		}
	}
	return w.ahead
}

// peakWith is the most the held conversations and a new one (own tokens
// after done of turns, on prefix of prefixTok tokens) will hold at once in
// the turns to come, every conversation taking one turn at a time: those
// admitted together grow together and peak at their last turn, while
// conversations at every stage peak about a turn's growth above what they
// hold now, since the oldest end as the others grow.
func (w *warmSet) peakWith(own float64, done, turns int, prefix uint64, prefixTok float64) float64 {
	ahead := w.aheadTokens()
	peak := 0.0
	for k := range max(len(ahead), turns-done+1) {
		held := w.shared
		if k < len(ahead) {
			held = ahead[k]
		}
		peak = max(peak, held+ownAhead(own, done, turns, k))
	}
	return peak + w.need(0, prefix, prefixTok)
}

// heldConv is one held conversation.
type heldConv struct {
	ep *endpoint
	// own is its context beyond its shared prefix after done turns: its
	// last answered turn's prompt and answer, or, while its first turn
	// runs, the request's estimate.
	own       float64
	done      int
	turn      int // the turn sent last, of turns
	turns     int
	prefix    uint64
	prefixTok float64
	busy      bool      // a turn of it is in flight
	idleSince time.Time // when its last turn was answered
	// prompt is its last answered turn's prompt tokens as the server
	// counted them; expect, while a turn sent back to the same endpoint
	// runs, the cached tokens it should find there (that prompt).
	prompt, expect float64
	// Between turns: the lane its next turn waits in (nil: not known) and
	// the claims this worker had started when it began to wait
	// (dropTakenLocked).
	nextIn *lane
	idleAt uint64
	// hist is what its last answered turn built, for its next (history.go).
	hist *convHistory
}

// admission is the dispatcher's held conversations, by sample id (guarded
// by Dispatcher.mu).
type admission struct {
	byID       map[string]*heldConv
	idle       int // held conversations with no turn in flight
	expiredAt  time.Time
	refusedNew int64  // first turns no endpoint admitted, for tests and views
	claims     uint64 // claims started (claimStartLocked)
	shared     bool   // some endpoint has other workers sending to it (SetSharers)
}

// admitsLocked reports whether e takes a new conversation with footprint
// est and affinity a. Anything else is always taken.
func (d *Dispatcher) admitsLocked(e *endpoint, est float64, a affinity) bool {
	if !a.newConv || d.cfg.NoAdmission {
		return true
	}
	peak := e.warm.peakWith(max(est-a.prefixTok, 0), a.turn+1, a.turns, a.prefix, a.prefixTok)
	return admitsShare(e.load.capacity*e.warm.scaleOr1(), peak, e.warm.convs, e.warm.sharers)
}

// SetSharers tells admission how many live workers, this one included,
// send to each endpoint by URL (an endpoint not named: this one alone).
// Each then holds conversations against its part of the pool. A part
// that grew lets refused lanes try new conversations again.
func (d *Dispatcher) SetSharers(byURL map[string]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	grew := false
	d.adm.shared = false
	for _, e := range d.eps {
		n := max(byURL[e.url], 1)
		grew = grew || n < max(e.warm.sharers, 1)
		e.warm.sharers = n
		d.adm.shared = d.adm.shared || n > 1
	}
	if grew {
		for _, l := range d.lanes {
			l.admBlocked = false
		}
	}
}

// holdLocked records that conversation id's turn (footprint est, affinity
// a) starts on e: it is held there, moved from another endpoint if its
// turn went elsewhere. It returns the hold (nil: none), which the turn's
// settle passes to turnDoneLocked.
func (d *Dispatcher) holdLocked(id string, e *endpoint, est float64, a affinity) *heldConv {
	if !a.conv || d.cfg.NoAdmission {
		return nil
	}
	if d.adm.byID == nil {
		d.adm.byID = map[string]*heldConv{}
	}
	expect := 0.0
	// A first turn counts at its estimate; a next turn keeps what its last
	// answer's usage set (the stored prompt estimate is the first turn's),
	// and one held anew (its hold was dropped, or the runner restarted)
	// counts at the context of the turn before as the store keeps it, as
	// turnDoneLocked would have left it: at the first turn's estimate it
	// counted a fraction of its size, on the endpoint it is pinned to.
	own, done := max(est-a.prefixTok, 0), a.turn+1
	if a.turn > 0 && a.prevCtx > 0 {
		own, done = max(a.prevCtx-a.prefixTok, own), a.turn
	}
	if h, ok := d.adm.byID[id]; ok {
		h.ep.warm.remove(h)
		if !h.busy {
			d.adm.idle--
		}
		if h.ep == e {
			expect = h.prompt // back where its history should be
		}
		own, done = h.own, h.done
	}
	h := &heldConv{ep: e, own: own, done: done, prefix: a.prefix, prefixTok: a.prefixTok, busy: true, turn: a.turn, turns: a.turns,
		expect: expect}
	d.adm.byID[id] = h
	e.warm.add(h)
	return h
}

// turnDoneLocked updates conversation id after its turn, held as turn
// (holdLocked's), settled: held between turns with its context at ctx
// tokens when next (its next turn is pending), dropped otherwise. u is the
// answer's usage (zero when none): a next turn sent back to its endpoint
// tells whether its history was still cached there (warmSet.judge). A
// hold that is no longer turn's is left alone: the next turn, committed
// pending before this settle took d.mu, was claimed and started already,
// and is in flight.
func (d *Dispatcher) turnDoneLocked(id string, turn *heldConv, next bool, ctx float64, u llm.Usage, now time.Time) {
	h, ok := d.adm.byID[id]
	if !ok || h != turn {
		return
	}
	if u.CachedTokens > 0 {
		h.ep.warm.reported = true
	}
	if h.expect > 0 && u.PromptTokens > 0 && h.ep.warm.reported {
		h.ep.warm.judge(float64(u.CachedTokens) >= keptShare*h.expect)
	}
	h.expect, h.prompt = 0, float64(u.PromptTokens)
	if !next {
		d.dropLocked(id, h)
		return
	}
	h.ep.warm.remove(h)
	h.own, h.done = max(ctx-h.prefixTok, 0), h.turn+1
	h.ep.warm.add(h)
	if h.busy {
		h.busy = false
		d.adm.idle++
	}
	h.idleSince, h.idleAt = now, d.adm.claims
}

// nextTurnInLocked notes that conversation id, held as turn, waits for its
// next turn in lane l.
func (d *Dispatcher) nextTurnInLocked(id string, turn *heldConv, l *lane) {
	if h, ok := d.adm.byID[id]; ok && h == turn && !h.busy {
		h.nextIn = l
	}
}

// claimStartLocked numbers a claim about to ask the store for samples.
func (d *Dispatcher) claimStartLocked() uint64 {
	d.adm.claims++
	return d.adm.claims
}

// dropTakenLocked drops the held conversations whose next turn another
// worker sharing the store has claimed, at once rather than after
// heldIdle: a claim of lane l (number seq, n asked for) that came back
// short, or with a first turn, was handed every next turn waiting in l
// (the store gives those out first), so a conversation that waited for
// its next turn in l before the claim began, got none and is not leased
// here, has it running elsewhere. Only on an endpoint shared with other
// workers: alone, this worker's claim is the only one. A next turn a
// concurrent claim had locked but left is dropped too; it is held again
// when it starts here (a next turn is always admitted).
func (d *Dispatcher) dropTakenLocked(l *lane, seq uint64, claimed []store.Claimed, n int) {
	if !d.adm.shared {
		return
	}
	handedAll := len(claimed) < n
	got := make(map[string]bool, len(claimed))
	for _, c := range claimed {
		got[c.ID] = true
		handedAll = handedAll || c.Turn == 0
	}
	if !handedAll {
		return
	}
	for id, h := range d.adm.byID {
		if _, leased := d.held[id]; !leased && !h.busy && h.nextIn == l && h.idleAt < seq && h.ep.warm.sharers > 1 && !got[id] {
			d.dropLocked(id, h)
		}
	}
}

func (d *Dispatcher) dropLocked(id string, h *heldConv) {
	h.ep.warm.remove(h)
	if !h.busy {
		d.adm.idle--
	}
	delete(d.adm.byID, id)
	for _, l := range d.lanes {
		l.admBlocked = false
	}
}

// expireLocked drops conversations idle for heldIdle, at most every few
// seconds.
func (d *Dispatcher) expireLocked(now time.Time) {
	if now.Sub(d.adm.expiredAt) < heldIdle/16 {
		return
	}
	d.adm.expiredAt = now
	for id, h := range d.adm.byID {
		if _, leased := d.held[id]; leased {
			continue // its next turn is claimed here, waiting for its endpoint (pinnedLocked)
		}
		if !h.busy && now.Sub(h.idleSince) >= heldIdle {
			d.dropLocked(id, h)
		}
	}
}

// claimCapLocked caps a claim of n samples of lane l while no endpoint
// admits a new conversation of it: at the held conversations waiting for
// their next turn. Another lane (single-turn samples) is claimed as before.
func (d *Dispatcher) claimCapLocked(l *lane, n int) int {
	if !l.admBlocked {
		return n
	}
	return min(n, max(d.adm.idle, 0))
}

// refusedLocked notes that a new conversation of lane l was not started
// although an endpoint had room for the lane: admission kept it out.
func (d *Dispatcher) refusedLocked(l *lane, now time.Time, a affinity) {
	if !a.newConv || d.cfg.NoAdmission {
		return
	}
	for _, e := range d.eps {
		if e.roomLocked(l, now) > 0 {
			l.admBlocked = true
			d.adm.refusedNew++
			return
		}
	}
}

// priorityFor is the "priority" field of a request to a server that
// orders its queue by it (nil: none sent): a held conversation's next
// turn goes ahead of every other request.
func priorityFor(s *Server, later bool) *int {
	if s == nil || s.Priority == 0 {
		return nil
	}
	p := 0
	if later {
		p = s.Priority
	}
	return &p
}

// pinnedLocked is the only endpoint a conversation's next turn (affinity
// a) may go to under admission, nil when it may go anywhere: the endpoint
// of the turn before, unless that one is paused (down, draining) or its
// breaker is not closed. The endpoint admitted the conversation to keep
// its history warm, and its turn waits there for room rather than prefill
// the whole history elsewhere and leave it cached, dead, behind.
func (d *Dispatcher) pinnedLocked(a affinity) *endpoint {
	if !a.conv || a.prev == "" || d.cfg.NoAdmission {
		return nil
	}
	e := d.epByURL[a.prev]
	if e == nil || e.paused || !e.breakerClosed() {
		return nil
	}
	return e
}
