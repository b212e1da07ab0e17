package dispatch

import (
	"hash/fnv"
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/store"
)

// Affinity: keep a request where its prompt's prefix is cached.
//
// Turn k of a conversation sends turns 0..k-1 again, and the server that
// answered turn k-1 computed them moments ago and still holds them in its
// prefix cache (docs/engines.md §14); any other server prefills them
// again. Rows that share a long system prompt and tool list gain the same
// way from meeting on one server. So, among the endpoints with room for
// the request's lane (which excludes endpoints that are down, paused,
// held for backpressure or at their limits):
//
//  1. a later turn goes to the endpoint that answered the turn before it
//     (the store keeps it with every turn, store.Result.Endpoint, so a
//     restarted runner or another worker sharing the store knows it), unless
//     its breaker is not closed or it is clearly more loaded than the
//     least loaded candidate;
//  2. otherwise a request whose shared prefix (conversation.SharedPrefix) is
//     at least prefixMinBytes goes to the first endpoint, in the prefix's
//     own rendezvous order of the endpoints' URLs, that is not clearly more
//     loaded (a prefix hash with bounded load: each prefix has a home, and
//     its next choices when the home is busy, the same for every worker);
//     a new conversation under admission goes to the first that admits it
//     whatever its load (admission bounds it), so each endpoint keeps the
//     prefixes homed on it warm, not every prefix;
//  3. otherwise, and for every request when affinity is off, the least
//     loaded candidate, as token-aware balancing decides (balance.go).
//
// "Clearly more loaded" is sgl-router's cache_aware balance rule in regen's
// load units: an endpoint's load exceeds the least loaded candidate's by
// more than an absolute margin and by more than a ratio. Load is the pool's
// expected fill after the request (the same score balance.go ranks by);
// while some pool is unknown it is the requests in flight.
const (
	affinityAbsFill = 0.15 // points of KV pool fill
	affinityAbsReqs = 4    // requests in flight, while a pool is unknown
	affinityRel     = 1.5  // times the least loaded candidate's load
	// prefixMinBytes is the shared prefix worth steering: about 500 tokens.
	prefixMinBytes = 2048
	// bytesPerToken is the prompt estimate's ratio (store.Claimed.PromptTokens).
	bytesPerToken = 4
)

// affinity is what a request asks of balancing beyond its footprint.
type affinity struct {
	prev   string // the endpoint of the turn before ("" for a first turn)
	prefix uint64 // its shared prefix's key (0 = none worth steering)
	// For admission (admit.go): the sample is a conversation (more than
	// one turn), at its first turn (newConv); prefixTok is its shared
	// prefix's estimated tokens when prefix is set.
	conv, newConv bool
	prefixTok     float64
	turn, turns   int // the turn claimed (0 = the first) of the plan's turns
	// admitted: a new conversation under admission, which bounds each
	// endpoint's load by its pool; it keeps its prefix's order however
	// loaded the endpoints are (chooseKept).
	admitted bool
	// prevCtx is the context of the turn before as the server counted it
	// (its prompt and completion tokens; 0 = not known).
	prevCtx float64
}

// affinityOf reads c's affinity: the endpoint that answered its previous
// turn, and its shared prefix when long enough.
func affinityOf(c store.Claimed) affinity {
	return affinityFrom(c, conversation.ShapeOf(c.Body))
}

// affinityFrom is affinityOf with the body's shape sh read already.
func affinityFrom(c store.Claimed, sh conversation.Shape) affinity {
	var a affinity
	if n := len(c.Prior); n > 0 {
		a.prev, a.prevCtx = c.Prior[n-1].Endpoint, priorContext(c.Prior[n-1])
	}
	if sh.PrefixBytes >= prefixMinBytes {
		a.prefix, a.prefixTok = sh.PrefixKey, float64(sh.PrefixText)/bytesPerToken
	}
	a.conv = sh.Turns > 1
	a.turn, a.turns = c.Turn, sh.Turns
	a.newConv = a.conv && c.Turn == 0
	return a
}

// priorContext is a stored turn's context as the server counted it.
func priorContext(r store.Result) float64 {
	return float64(max(r.PromptTokens, 0) + max(r.CompletionTokens, 0))
}

// candidate is an endpoint with room for the request, as the rule sees it.
type candidate struct {
	url    string
	load   float64
	closed bool // breaker closed (a half-open one only takes the least-loaded path)
}

// clearlyMoreLoaded is the balance rule: load is clearly above least.
func clearlyMoreLoaded(load, least float64, byTokens bool) bool {
	abs := float64(affinityAbsReqs)
	if byTokens {
		abs = affinityAbsFill
	}
	return load-least > abs && load > least*affinityRel
}

// choose applies the rule to candidates (in round-robin order, so ties
// between equally loaded ones rotate) and returns the index chosen.
func choose(cands []candidate, a affinity, byTokens bool) int {
	i, _ := chooseKept(cands, a, byTokens)
	return i
}

// chooseKept is choose, and whether the request went where its prefix is
// expected cached (steps 1 and 2 of the rule) rather than to the least
// loaded candidate.
func chooseKept(cands []candidate, a affinity, byTokens bool) (int, bool) {
	if len(cands) == 0 {
		return -1, false
	}
	least := 0
	for i, c := range cands {
		if c.load < cands[least].load {
			least = i
		}
	}
	ok := func(i int) bool {
		return cands[i].closed && !clearlyMoreLoaded(cands[i].load, cands[least].load, byTokens)
	}
	if a.prev != "" {
		if i := slices.IndexFunc(cands, func(c candidate) bool { return c.url == a.prev }); i >= 0 && ok(i) {
			return i, true
		}
	}
	if a.prefix != 0 {
		if a.admitted {
			ok = func(i int) bool { return cands[i].closed }
		}
		order := make([]int, len(cands))
		for i := range order {
			order[i] = i
		}
		w := func(i int) uint64 { return rendezvous(a.prefix, cands[i].url) }
		slices.SortFunc(order, func(x, y int) int {
			wx, wy := w(x), w(y)
			switch {
			case wx > wy:
				return -1
			case wx < wy:
				return 1
			}
			return 0
		})
		for _, i := range order {
			if ok(i) {
				return i, true
			}
		}
	}
	return least, false
}

// returnRoomLocked reports whether a conversation's next turn may go back
// to e, the endpoint of the turn before, although its auto limit for lane
// l is full. The slot its last turn freed there is taken, as often as not,
// by another conversation's turn claimed first, whose own endpoint was
// full; without this allowance next turns trade endpoints and miss their
// cached prefix whenever the limits are in use, which under load is always.
// The allowance is a tenth of the limit (at least one request), within
// the breaker's and the crash ceiling's room; the controller is fed the
// in-flight count without these requests, so it still cuts when it must.
func (e *endpoint) returnRoomLocked(l *lane, now time.Time) bool {
	if l.auto == nil || e.capacity(now) == 0 || !e.breakerClosed() {
		return false
	}
	if e.ceiling > 0 && e.inflight >= e.ceiling {
		return false
	}
	el := &e.lanes[l.idx]
	return el.over < max(1, el.ctl.Limit()/10)
}

// reuseLocked reports whether most of the requests sent to el in the last
// interval that sent any came for a prefix cached there (a conversation's
// next turn on the endpoint of the turn before, a shared prefix on its
// home), and starts a new interval.
func (el *epLane) reuseLocked() bool {
	if el.sent > 0 {
		el.reuse = 2*el.kept >= el.sent
	}
	el.sent, el.kept = 0, 0
	return el.reuse
}

// noteSentLocked counts a request of lane idx sent to e, and whether the
// affinity rule sent it there for its cached prefix.
func (e *endpoint) noteSentLocked(idx int, kept bool) {
	el := &e.lanes[idx]
	el.sent++
	if kept {
		el.kept++
	}
}

// rendezvous is the weight of url for a prefix key (highest random weight
// hashing): every worker ranks the endpoints in the same order for a key.
func rendezvous(key uint64, url string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(key >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(url))
	return mix64(h.Sum64())
}

// mix64 spreads FNV's weak low bits (splitmix64's finaliser).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// startGrace is how long a dispatcher whose endpoints start paused (the
// runner pauses them until each is seen ready) holds its claims after the
// first is resumed, until every one has been: endpoints probed together
// come up within moments of each other, and a conversation's next turn
// claimed in between would go to the first one up instead of its own. An
// endpoint still down after startGrace does not hold the others longer.
const startGrace = 5 * time.Second

// startHoldLocked reports whether claims wait for endpoints still starting,
// and until when at most.
func (d *Dispatcher) startHoldLocked(now time.Time) (time.Time, bool) {
	if d.cfg.NoAffinity || d.firstResume.IsZero() {
		return time.Time{}, false
	}
	until := d.firstResume.Add(startGrace)
	if !now.Before(until) {
		return time.Time{}, false
	}
	for _, e := range d.eps {
		if e.paused && !e.resumed {
			return until, true
		}
	}
	return time.Time{}, false
}
