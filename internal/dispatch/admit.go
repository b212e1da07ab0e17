package dispatch

import (
	"time"

	"github.com/regen-dev/regen/internal/llm"
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
//     turn until its last turn is answered, it fails or is given back, or
//     it waited heldIdle for its next turn (another worker took it);
//   - its warm footprint is its context: while a turn runs, the turn's
//     prompt and the lane's mean answer (the request's estimate), and
//     between turns the prompt and answer of the last one as the server
//     counted them; its shared prefix (system prompt and tools) counts once
//     per endpoint however many held conversations share it;
//   - a new conversation's first turn goes only to an endpoint whose warm
//     tokens and its own stay within warmShare of the pool (admits); an
//     endpoint holding none takes one whatever its size, and one whose pool
//     is not known yet takes blindConvs;
//   - a held conversation's next turn is never refused: the pool was kept
//     for it. The store hands next turns out before first turns, and a
//     server that schedules by priority is told so (Server.Priority).
//
// While no endpoint admits a new conversation, the claim loop asks the
// store for no more samples than held conversations wait for their next
// turn (claimCapLocked), so refused first turns are not claimed and given
// back in a loop; the first conversation to leave lifts that.

// warmShare is the part of an endpoint's KV pool its held conversations
// may fill; the rest is the headroom running requests grow into (a turn's
// answer is estimated at the lane's mean, and some run longer).
const warmShare = 0.9

// heldIdle is how long a held conversation may wait for its next turn
// before it is dropped: its next turn was taken by another worker sharing
// the store, or never came back.
const heldIdle = 2 * time.Minute

// blindConvs is how many conversations an endpoint whose pool is not known
// yet holds: the first claims come before the first probe, and a job
// that started every conversation then would fill the pools several times
// over with histories that all grow together.
const blindConvs = 8

// admits reports whether an endpoint with a KV pool of pool tokens (0 =
// unknown), holding convs conversations of warm tokens, takes a new
// conversation that adds need tokens.
func admits(pool, warm, need float64, convs int) bool {
	switch {
	case convs == 0:
		return true
	case pool <= 0:
		return convs < blindConvs
	}
	return warm+need <= warmShare*pool
}

// warmSet is one endpoint's held conversations' footprint (guarded by
// Dispatcher.mu).
type warmSet struct {
	tokens   float64        // own tokens of every held conversation, and each shared prefix once
	convs    int            // conversations held
	prefixes map[uint64]int // held conversations per shared prefix
	// scale multiplies the pool admission counts against (0 = 1), moved by
	// what next turns sent back here found cached (judge); reported: the
	// server reports cached tokens at all (one answer said some).
	scale        float64
	reported     bool
	judged, lost int
}

// Feedback on the warm share. Projected contexts are an estimate, and
// conversations stand at every stage at once, so the pool usually holds
// more than they are counted at. Every judgeWindow next turns sent back to
// the endpoint of the turn before, the share of them that did not find at
// least keptShare of their previous prompt cached moves the scale:
// none lost raises it by scaleUp (to at most maxScale), more than
// lostShare lowers it by scaleDown (to at least minScale). A server that
// reports no cached tokens leaves it at 1.
const (
	judgeWindow = 32
	keptShare   = 0.9
	lostShare   = 0.05
	scaleUp     = 1.1
	scaleDown   = 0.9
	minScale    = 0.5
	maxScale    = 3
	// startScale is the scale before any judgement: a projected context is
	// the conversation's largest, and the held ones stand at every stage.
	startScale = 1.5
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
	if h.prefix == 0 {
		w.tokens += h.prefixTok
		return
	}
	if w.prefixes == nil {
		w.prefixes = map[uint64]int{}
	}
	if w.prefixes[h.prefix] == 0 {
		w.tokens += h.prefixTok
	}
	w.prefixes[h.prefix]++
}

func (w *warmSet) remove(h *heldConv) {
	w.tokens = max(w.tokens-h.own, 0)
	w.convs--
	if h.prefix == 0 {
		w.tokens = max(w.tokens-h.prefixTok, 0)
		return
	}
	if w.prefixes[h.prefix]--; w.prefixes[h.prefix] <= 0 {
		delete(w.prefixes, h.prefix)
		w.tokens = max(w.tokens-h.prefixTok, 0)
	}
}

// heldConv is one held conversation.
type heldConv struct {
	ep        *endpoint
	own       float64 // context tokens beyond its shared prefix, projected (project)
	turn      int     // the turn sent last, of turns
	turns     int
	prefix    uint64
	prefixTok float64
	busy      bool      // a turn of it is in flight
	idleSince time.Time // when its last turn was answered
	// prompt is its last answered turn's prompt tokens as the server
	// counted them; expect, while a turn sent back to the same endpoint
	// runs, the cached tokens it should find there (that prompt).
	prompt, expect float64
	// hist is what its last answered turn built, for its next (history.go).
	hist *convHistory
}

// admission is the dispatcher's held conversations, by sample id (guarded
// by Dispatcher.mu).
type admission struct {
	byID       map[string]*heldConv
	idle       int // held conversations with no turn in flight
	expiredAt  time.Time
	refusedNew int64 // first turns no endpoint admitted, for tests and views
}

// admitsLocked reports whether e takes a new conversation with footprint
// est and affinity a. Anything else is always taken.
func (d *Dispatcher) admitsLocked(e *endpoint, est float64, a affinity) bool {
	if !a.newConv || d.cfg.NoAdmission {
		return true
	}
	return admits(e.load.capacity*e.warm.scaleOr1(), e.warm.tokens, e.warm.need(project(est-a.prefixTok, a.turn+1, a.turns), a.prefix, a.prefixTok), e.warm.convs)
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
	// answer's usage set (the stored prompt estimate is the first turn's).
	own := project(est-a.prefixTok, a.turn+1, a.turns)
	if h, ok := d.adm.byID[id]; ok {
		h.ep.warm.remove(h)
		if !h.busy {
			d.adm.idle--
		}
		if h.ep == e {
			expect = h.prompt // back where its history should be
		}
		own = h.own
	}
	h := &heldConv{ep: e, own: own, prefix: a.prefix, prefixTok: a.prefixTok, busy: true, turn: a.turn, turns: a.turns,
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
	h.own = project(ctx-h.prefixTok, h.turn+1, h.turns)
	h.ep.warm.add(h)
	if h.busy {
		h.busy = false
		d.adm.idle++
	}
	h.idleSince = now
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

// projectConversations: a held conversation counts at the context it will
// have after its last turn, at the rate it grew so far, not at its context
// now: conversations admitted together grow together, and counted at
// their first turn's size they would fill the pool several times over by
// their last.
const projectConversations = true

// project is a conversation's own context (beyond its shared prefix) after
// its last turn, from own tokens after done of its turns.
func project(own float64, done, turns int) float64 {
	own = max(own, 0)
	if !projectConversations || done <= 0 || turns <= done {
		return own
	}
	return own * float64(turns) / float64(done)
}
