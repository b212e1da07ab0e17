package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"hash/maphash"
	"slices"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// History reuse: a conversation's next turn is built from its last.
//
// Built from the store alone, turn k's request decodes the sample body,
// decodes the k stored answers, encodes them again and writes the whole
// history out: five passes over a history that grows every turn
// (BenchmarkTurnCost). A held conversation (admit.go) keeps instead what
// its last turn built: the decoded plan, that turn's request and the answer
// stored for it (history form). Its next turn adds the answer and the next
// input to the request as one more piece (conversation.Plan.NextParts;
// joined, the bytes of Plan.Request), which the client sends as they are
// (llm.Member.Pieces, one writev), and takes its affinity from what is
// kept, so it copies none of the history.
//
// The claim names the conversations whose histories are kept, each at the
// turn after its own and with the lease its answer was stored under
// (store.Queue.ClaimKept): the store hands those turns over Kept, without
// reading the body and the earlier answers again (at 16k tokens of history
// that read was most of the claim), when no claim came between; each turn
// is stored once and a body changes only with a new generation, which
// restarts the sample at its first turn, so the kept history is the
// store's; it is kept before its answer's commit, and a turn handed over
// Kept waits for that commit and is given back if it failed
// (convHistory.storedAnswer). A turn handed over whole (another turn, the lease lost and the
// sample claimed elsewhere, a restart, a new generation) uses the kept
// history only if the body and answers are the ones it was built from (the
// same body bytes, the same stored answer to the turn before, the turn
// after it); otherwise the turn is built from the store. It lives on the
// conversation's hold, so it is bounded as holds are (by the KV pools
// admission fills) and dropped with the hold: when the conversation ends,
// fails, is given back, or waits heldIdle for its next turn.
//
// Measured with BenchmarkTurnCost (-benchtime 3x, three interleaved runs
// on 2 shared cores, medians with ranges), CPU per turn over whole
// 4-turn conversations (conv=): 1k tokens of history 296 (295-336) ->
// 251 (239-255) µs, 4k 408 (378-414) -> 293 (290-300), 16k 885 (829-895)
// -> 435 (416-455); 16k/1k 2.99 -> 1.73 (1.66-1.90). Claiming kept turns
// without their body and answers (ClaimKept) and the first turn's single
// check of the body (rawjson.CheckedArray): nine interleaved runs on a
// quiet machine, before -> after, 1k 240 (224-292) -> 222 (201-300) µs, 4k
// 259 (249-295) -> 251 (232-312), 16k 384 (364-506) -> 333 (305-410);
// 16k/1k 1.60 -> 1.50 (1.35-1.64 per run). What still grows, 16k against
// 1k (10-run profile): sending the history (the floor, plain net/http,
// 43 -> 90 µs), the first turn's checking walk of the body (+28 µs a turn
// over the four) and its read in the claim (+10), GC and copies (+25),
// NextRequest's one copy (+3). Then a claim that no longer compiles again
// when n changes (every job's turn), the body and answers read without
// database/sql's second copy, and the store-built turn sending answers as
// stored (rawjson.AppendQuoted): six interleaved runs, before -> after,
// conv 1k 243 -> 214 µs, 4k 272 -> 230, 16k 357 -> 325; the runner's own
// growth over the floor's, 16k against 1k, 76 -> 69 µs (ratio net of the
// floor 1.38 -> 1.40); built from the store (history=) 308 -> 267, 402 ->
// 321, 739 -> 544. Then the runner's own growth (conv 16k - 1k net of
// the floor's; per-run medians with ranges of 4-8 runs interleaved with
// main): the first turn's body split unchecked (DecodeStored) and its
// prefix key by maphash, 46 (31-84) -> 30 (19-64) µs; the body written by
// one writev from its pieces (no 32 KB copy buffer per request), 17
// (-35-45), 195 -> 155 MB allocated per 16k run; next turns sent in pieces
// (NextParts), not one copy of the history each, 9 (6-12), 92 MB; this
// history kept before its answer's commit (settle), so the claim right
// after a group commit names it: next turns claimed Kept 82% -> 100%
// (mt4 in bench/sweep 88% -> 99.8%), 7 (-50-47) against main's 48
// (-2-112) in the same eight runs, 77 MB. What still grows, 16k against 1k
// (10-run profile): the first turn's read of the body in the claim (about
// 27 µs a turn; PRAGMA mmap_size took about 20 off it in three runs, not
// adopted: the store's call, and mapped pages count in RSS), sending it
// (the floor) and its unchecked split (7).

// convHistory is what one turn of a held conversation built, kept for its
// next turn. It is not changed once made, but for its commit's outcome,
// written once before settled is closed.
type convHistory struct {
	turn   int    // the turn request was built for
	sample []byte // the sample body plan was decoded from
	plan   *conversation.Plan
	tools  []string
	// request is turn's request, in pieces (turn.request); answer the
	// answer stored for it, as the store hands it back
	// (reply.DecodeHistory), and stored the hash of the stored bytes.
	request [][]byte
	answer  llm.Result
	stored  uint64
	// token is the lease the answer was stored under (Claimed.Token), for
	// the claim of the next turn (store.Kept); storedAt and storedCtx the
	// endpoint that gave it and its context (the affinity's previous turn).
	token     int64
	storedAt  string
	storedCtx float64
	// seq is the sample's place in the claim order (Claimed.Seq).
	seq int64
	// The affinity read from the sample body (affinityOf).
	prefix    uint64
	prefixTok float64
	turns     int
	// settled is closed when the commit of the answer returned (settle),
	// committed whether it took: the history is kept before that commit,
	// so a claim may hand its next turn over Kept before the answer is
	// known to be the store's (storedAnswer).
	settled   chan struct{}
	committed bool
}

// answerSeed hashes stored answers for the check that a kept history's
// answer is the store's.
var answerSeed = maphash.MakeSeed()

// keptHistory builds the history turn t of held conversation h keeps
// after its answer was stored (t.stored): nil when there is no next turn
// to build from it or the stored answer does not read back.
func keptHistory(c store.Claimed, t *turn, h *heldConv) *convHistory {
	if h == nil || t == nil || t.stored == nil || t.index+1 >= t.plan.NumTurns() {
		return nil
	}
	res, err := reply.DecodeHistory(store.Result{Response: t.stored})
	if err != nil {
		return nil
	}
	return &convHistory{turn: t.index, sample: c.Body, plan: t.plan, tools: t.tools, request: t.request(),
		answer: res, stored: maphash.Bytes(answerSeed, t.stored), token: c.Token, storedAt: t.storedAt, storedCtx: t.storedCtx,
		seq: c.Seq, prefix: h.prefix, prefixTok: h.prefixTok, turns: h.turns, settled: make(chan struct{})}
}

// settle records the outcome of the commit of h's answer (nil h: no
// history was kept).
func (h *convHistory) settle(committed bool) {
	if h != nil {
		h.committed = committed
		close(h.settled)
	}
}

// storedAnswer reports whether h's answer is the store's, for a claim that
// handed h's next turn over Kept. The store checked the turn, and SQLite
// nothing more (no lease token): another attempt of h's turn in this
// runner (its lease expired while h's request was open and the sample was
// claimed again) may have stored its own answer first, and h's commit then
// fails. That commit is under way (the claim saw the turn after it), so
// this waits for its reply, which wants nothing of the claim loop. False
// when the commit failed or ctx ends first: the turn goes back unspent
// (startAll).
func (h *convHistory) storedAnswer(ctx context.Context) bool {
	if h.settled == nil {
		return true // not kept before a commit (keptHistory always is)
	}
	select {
	case <-h.settled:
		return h.committed
	case <-ctx.Done():
		return false
	}
}

// fits reports whether claim c is the turn after h's, of the same body,
// with h's answer stored for the turn before: the store vouched for both
// when it handed c over Kept.
func (h *convHistory) fits(c store.Claimed) bool {
	if h == nil || c.Turn != h.turn+1 {
		return false
	}
	if c.Kept {
		return true
	}
	if len(c.Prior) != c.Turn {
		return false
	}
	return maphash.Bytes(answerSeed, c.Prior[h.turn].Response) == h.stored && bytes.Equal(c.Body, h.sample)
}

// kept is what the claim of h's next turn names (store.Kept).
func (h *convHistory) kept(id string) store.Kept {
	return store.Kept{ID: id, Turn: h.turn + 1, Token: h.token}
}

// affinity is c's affinity (affinityOf) from what h kept.
func (h *convHistory) affinity(c store.Claimed) affinity {
	return affinity{prev: h.storedAt, prevCtx: h.storedCtx, prefix: h.prefix, prefixTok: h.prefixTok,
		conv: h.turns > 1, turn: c.Turn, turns: h.turns}
}

// nextTurn is the turn after h's, built from it; nil when it cannot be
// (prepareTurn then builds it from the store).
func (d *Dispatcher) nextTurn(h *convHistory) *turn {
	parts, err := h.plan.NextParts(h.request, h.turn, h.answer, d.cfg.KeepReasoning)
	if err != nil {
		return nil
	}
	d.historyReused.Add(1)
	k := h.turn + 1
	t := &turn{index: k, plan: h.plan, tools: h.tools, parts: parts, members: h.plan.MembersOf(k, parts)}
	if t.members == nil {
		// The client walks the body (its values are not compact): one slice.
		t.body, t.parts = bytes.Join(parts, nil), nil
	}
	return t
}

// keepHistoryLocked keeps hist on conversation id's hold while it is still
// the hold of the turn that built it, from before that turn's answer is
// stored (settle).
func (d *Dispatcher) keepHistoryLocked(id string, turn *heldConv, hist *convHistory) {
	if h, ok := d.adm.byID[id]; ok && h == turn && hist != nil {
		h.hist = hist
	}
}

// keptFor lists the held conversations whose next turn may wait in lane l
// with a history kept for it, for a claim of n samples to leave their body
// and earlier answers in the store (store.Queue.ClaimKept). The list is
// sent with every claim, so it is bounded by the claim's size (keptPerClaim
// each), not the holds: a conversation left out is read whole, as after a
// restart. Those named are the ones the claim hands out first (later
// turns in sample order, store.CompareClaims): a saturated runner claims
// one or two at a time while hundreds are held, and a pick in map order
// would miss the next turns the claim takes.
func (d *Dispatcher) keptFor(l *lane, n int) []store.Kept {
	type candidate struct {
		id string
		h  *convHistory
	}
	d.mu.Lock()
	var all []candidate
	for id, h := range d.adm.byID {
		// A busy hold is named while its turn's answer is being stored:
		// its history is then for the turn after the one in flight.
		if h.hist != nil && (!h.busy || h.hist.turn == h.turn) && (h.nextIn == nil || h.nextIn == l) {
			all = append(all, candidate{id, h.hist})
		}
	}
	d.mu.Unlock()
	slices.SortFunc(all, func(a, b candidate) int { return cmp.Compare(a.h.seq, b.h.seq) })
	kept := make([]store.Kept, 0, min(len(all), keptPerClaim*n))
	for _, c := range all[:min(len(all), keptPerClaim*n)] {
		kept = append(kept, c.h.kept(c.id))
	}
	return kept
}

// keptPerClaim bounds keptFor's list per sample claimed.
const keptPerClaim = 16
