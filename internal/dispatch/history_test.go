package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// historyBodies are conversations with what a kept history must carry
// over: a system prompt, tools, a seed, tool calls answered by the
// dataset's tool results, and four turns.
func historyBodies(t *testing.T, n int) map[string]string {
	t.Helper()
	raw := func(s string) json.RawMessage {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	seed := int64(7)
	out := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("h-%02d", i)
		var call llm.ToolCall
		call.ID, call.Type = "rec_1", "function"
		call.Function.Name, call.Function.Arguments = "look", `{"q":"`+id+`"}`
		b := conversation.Body{
			Messages: []conversation.Message{{Role: "system", Content: raw("be brief <always> & " + strings.Repeat("s", 300))}, {Role: "user", Content: raw(id)}},
			Tools:    json.RawMessage(`[{"type":"function","function":{"name":"look","parameters":{}}}]`),
			Turns: []conversation.Turn{
				{Input: []conversation.Message{{Role: "user", Content: raw(id + " q1")}}},
				{Calls: []llm.ToolCall{call}, Input: []conversation.Message{{Role: "tool", Content: raw(`{"found":"é"}`), ToolCallID: "rec_1"}}},
				{Input: []conversation.Message{{Role: "user", Content: raw(id + " q3 \u2028")}}},
			},
			Seed: &seed,
		}
		out[id] = string(conversation.Encode(&b))
	}
	return out
}

// recorded is one request as the client got it.
type recorded struct {
	body    []byte
	members []llm.Member
}

// TestKeptHistoryBuildsTheStoresRequest: every turn of a conversation,
// built from what its turn before kept, is byte for byte the request a
// runner builds from the store alone (after a restart: the body and the
// stored answers), tool calls, reasoning kept and characters JSON escapes
// included; the client is handed the body's members so it does not walk
// the history; next turns did use the kept history, sent in pieces
// without copying it (conversation.Plan.NextParts), and Run's last line
// says how many were claimed Kept.
func TestKeptHistoryBuildsTheStoresRequest(t *testing.T) {
	st := newFakeStore()
	addBodies(st, "short", historyBodies(t, 6))
	var logs logLines
	d, got := runHistories(t, st, func(cfg *Config) { cfg.Logger = logs.logger() })
	sentAsStored(t, d, st, got)
	// A settle that loses the race with the claim of its next turn leaves
	// that turn to the store; most next turns use what the turn before
	// kept, and most are claimed without their body and answers.
	if n := d.historyReused.Load(); n < 6 {
		t.Errorf("%d of 18 next turns built from a kept history, want most", n)
	}
	if st.keptClaims < 6 {
		t.Errorf("%d of 18 next turns claimed Kept (body and answers left in the store), want most", st.keptClaims)
	}
	// Each of those went out with its history in pieces, not copied again.
	pieced := 0
	for _, r := range got {
		if len(r.members) > 0 && r.members[0].Pieces != nil {
			pieced++
		}
	}
	if int64(pieced) != d.historyReused.Load() {
		t.Errorf("%d requests sent their messages in pieces, want the %d built from a kept history", pieced, d.historyReused.Load())
	}
	want := fmt.Sprintf("next_turns=18 from_kept_history=%d claimed_kept=%d", d.historyReused.Load(), st.keptClaims)
	if lines := logs.with("no work left", want); len(lines) != 1 {
		t.Errorf("Run's last line does not say %q", want)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.adm.byID); n != 0 {
		t.Errorf("%d conversations still held after the run, their histories kept", n)
	}
}

// TestKeptHistoryYieldsToAnotherWorkersTurns: when the store's history
// of a conversation is no longer the one this runner kept although the
// turn is the one it waits for (a new generation started and another
// worker answered its first two turns again, between this runner's
// answer to the second turn and its claim of the third), the claim hands
// the turn over whole and the request is built from the store's answers.
// Left out on the turn alone, the claim would send the kept history: the
// request would not be the store's.
func TestKeptHistoryYieldsToAnotherWorkersTurns(t *testing.T) {
	st := newFakeStore()
	addBodies(st, "short", historyBodies(t, 3))
	var w llm.ToolCall
	w.ID, w.Type = "call_w", "function"
	w.Function.Name, w.Function.Arguments = "look", `{"q":"h-01"}`
	again := []llm.Result{{Content: "regenerated 0", FinishReason: "stop"}, {Content: "regenerated 1", FinishReason: "tool_calls", ToolCalls: []llm.ToolCall{w}}}
	moved := false
	st.after = func(op string, x *fakeSample) {
		if op != "turn" || x.ID != "h-01" || x.turn != 2 || moved {
			return
		}
		moved = true
		x.prior = nil
		for k, r := range again {
			x.prior = append(x.prior, store.Result{Response: reply.Encode(r, "http://w", store.Provenance{}), FinishReason: r.FinishReason, Endpoint: "http://w", Turn: k})
			st.tokens++ // the other worker's claims
		}
		x.token = st.tokens
	}
	d, got := runHistories(t, st)
	if !moved {
		t.Fatal("h-01's second turn was never stored")
	}
	if x := st.get("h-01"); x.state != store.Done {
		t.Fatalf("h-01 %s: %s", x.state, x.reason)
	}
	sentAsStored(t, d, st, got, "h-01/0", "h-01/1") // sent before the store's answers changed
	if r, ok := got["h-01/2"]; !ok || !bytes.Contains(r.body, []byte("regenerated 1")) {
		t.Errorf("h-01's third turn sent without the store's answers:\n%s", r.body)
	}
}

// runHistories runs st's conversations against a client that records
// every request by sample and turn and answers it (a tool call at the
// second turn, which the dataset's tool result answers).
func runHistories(t *testing.T, st *fakeStore, opts ...func(*Config)) (*Dispatcher, map[string]recorded) {
	t.Helper()
	var mu sync.Mutex
	got := map[string]recorded{} // by sample/turn
	client := chatFunc(func(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
		var body struct {
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(requestBody(req), &body); err != nil {
			return llm.Result{}, &llm.Error{Class: llm.Malformed, Msg: err.Error()}
		}
		turn := 0
		for _, m := range body.Messages {
			if m.Role == "assistant" {
				turn++
			}
		}
		mu.Lock()
		got[fmt.Sprintf("%s/%d", req.RoutingKey, turn)] = recorded{bytes.Clone(requestBody(req)), req.Members}
		mu.Unlock()
		onDelta(1)
		res := llm.Result{Content: fmt.Sprintf("answer %d to %s: <b> & \"q\" \u2028 \xff", turn, req.RoutingKey), ReasoningContent: "think <",
			FinishReason: "stop", Usage: llm.Usage{PromptTokens: 100 * (turn + 1), CompletionTokens: 10}}
		if turn == 1 { // the dataset's call, which its tool result answers
			var call llm.ToolCall
			call.ID, call.Type = "call_x", "function"
			call.Function.Name, call.Function.Arguments = "look", `{"q":"`+req.RoutingKey+`"}`
			res.ToolCalls = []llm.ToolCall{call}
		}
		return res, nil
	})
	cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: client}})
	cfg.KeepReasoning = true
	for _, o := range opts {
		o(&cfg)
	}
	d := mustNew(t, cfg)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return d, got
}

// sentAsStored checks that every conversation sent its four turns, each
// byte for byte the request built from the store alone (its body and the
// answers stored when the run ended), with the body's members handed to
// the client; but the turns named in before, sent before the store's
// answers changed.
func sentAsStored(t *testing.T, d *Dispatcher, st *fakeStore, got map[string]recorded, before ...string) {
	t.Helper()
	if n, want := len(got), 4*len(st.samples); n != want {
		t.Fatalf("%d requests recorded, want %d (conversations of 4 turns): %v", n, want, st.states())
	}
	for key, r := range got {
		if slices.Contains(before, key) {
			continue
		}
		id, turn, _ := strings.Cut(key, "/")
		x := st.get(id)
		k := int(turn[0] - '0')
		c := store.Claimed{ID: id, Body: x.Body, Turn: k, Prior: append(x.prior, x.result)[:k]}
		want, err := d.prepareTurn(c, nil, nil)
		if err != nil {
			t.Fatalf("%s from the store: %v", key, err)
		}
		if !bytes.Equal(r.body, want.body) {
			t.Errorf("%s sent:\n%s\nbuilt from the store:\n%s", key, r.body, want.body)
		}
		members := map[string]json.RawMessage{}
		for _, m := range r.members {
			members[m.Key] = m.Bytes()
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &top); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(top, members); diff != "" {
			t.Errorf("%s members (-body +members):\n%s", key, diff)
		}
	}
}

// TestKeptHistoryFitsOnlyItsNextTurn: a kept history is used only for the
// turn after its own, of the same body, with its answer the stored one: an
// answer another worker stored, a changed body or another turn send the
// turn to the store.
func TestKeptHistoryFitsOnlyItsNextTurn(t *testing.T) {
	body := []byte(historyBodies(t, 1)["h-00"])
	p, err := conversation.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := p.Request(0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	answer := []byte(`{"v":1,"content":"mine","finish_reason":"stop"}`)
	tr := &turn{index: 0, plan: p, body: req, stored: answer}
	h := keptHistory(store.Claimed{ID: "h-00", Body: body}, tr, &heldConv{turns: 4})
	if h == nil {
		t.Fatal("no history kept after a turn with a next one")
	}
	next := store.Claimed{ID: "h-00", Body: body, Turn: 1, Prior: []store.Result{{Response: answer, Endpoint: "http://a"}}}
	if !h.fits(next) {
		t.Fatal("the history does not fit its own next turn")
	}
	cases := map[string]func(c *store.Claimed){
		"another answer": func(c *store.Claimed) {
			c.Prior = []store.Result{{Response: []byte(`{"v":1,"content":"theirs","finish_reason":"stop"}`)}}
		},
		"another body":  func(c *store.Claimed) { c.Body = bytes.Replace(body, []byte("h-00"), []byte("h-01"), 1) },
		"the same turn": func(c *store.Claimed) { c.Turn, c.Prior = 0, nil },
		"a later turn": func(c *store.Claimed) {
			c.Turn, c.Prior = 2, append(c.Prior, store.Result{Response: answer})
		},
		"a later turn handed over Kept": func(c *store.Claimed) { c.Turn, c.Body, c.Prior, c.Kept = 2, nil, nil, true },
	}
	for name, change := range cases {
		c := next
		c.Prior = append([]store.Result(nil), next.Prior...)
		change(&c)
		if h.fits(c) {
			t.Errorf("%s: the kept history fits", name)
		}
	}
	// Handed over Kept, its next turn fits without the body and answers,
	// and its claim names it at that turn under the lease it was stored in.
	if !h.fits(store.Claimed{ID: "h-00", Turn: 1, Kept: true}) {
		t.Error("the history does not fit its own next turn handed over Kept")
	}
	h2 := keptHistory(store.Claimed{ID: "h-00", Body: body, Token: 41}, tr, &heldConv{turns: 4})
	if got, want := h2.kept("h-00"), (store.Kept{ID: "h-00", Turn: 1, Token: 41}); got != want {
		t.Errorf("kept = %+v, want %+v", got, want)
	}
	if keptHistory(store.Claimed{Body: body}, &turn{index: 3, plan: p, body: req, stored: answer}, &heldConv{turns: 4}) != nil {
		t.Error("a history kept after the last turn")
	}
}

// TestKeptClaimWithoutItsHistoryGoesBack: a turn handed over Kept whose
// history is gone by the time it starts (its hold expired since the claim
// named it) has nothing to be built from: it is given back to the store
// unspent, not sent and not dead-lettered, and comes back whole.
func TestKeptClaimWithoutItsHistoryGoesBack(t *testing.T) {
	st := newFakeStore()
	addBodies(st, "short", historyBodies(t, 1))
	client := chatFunc(func(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
		t.Error("a Kept turn without its history was sent")
		return llm.Result{}, nil
	})
	d := mustNew(t, baseConfig(st, []Endpoint{{URL: "http://a", Client: client}}))
	claimed, err := st.Claim(t.Context(), "short", 1, "runner-1", time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	c := claimed[0]
	c.Turn, c.Body, c.Prior, c.Kept = 1, nil, nil, true
	if n := d.startAll(t.Context(), t.Context(), t.Context(), d.laneByName["short"], []store.Claimed{c}, 4); n != 0 {
		t.Errorf("%d started, want 0", n)
	}
	if x := st.get(c.ID); x.state != store.Pending || x.attempts != 0 || st.released != 1 {
		t.Errorf("sample %s, %d attempts, %d released; want pending, 0, 1", x.state, x.attempts, st.released)
	}
}

// TestKeptForNamesTheClaimsNextTurns: with more held conversations than a
// claim names, the claim names those it hands out first (later turns in
// sample order), leaving out busy ones and those waiting in another lane;
// named in map order, a claim of one would almost never name the next
// turn it takes.
func TestKeptForNamesTheClaimsNextTurns(t *testing.T) {
	d, _ := admitPair(t, false)
	l, other := d.lanes[0], &lane{}
	d.adm.byID = map[string]*heldConv{}
	var want []store.Kept
	for _, seq := range rand.Perm(200) {
		id := fmt.Sprintf("c%03d", seq)
		h := &heldConv{hist: &convHistory{turn: 1, seq: int64(seq), token: int64(1000 + seq)}}
		switch {
		case seq%7 == 3:
			h.busy = true // its next turn is claimed already
		case seq%7 == 5:
			h.nextIn = other
		case seq%7 == 6:
			h.nextIn = l
		}
		d.adm.byID[id] = h
	}
	eligible := 0
	for seq := range 200 {
		if seq%7 == 3 || seq%7 == 5 {
			continue
		}
		if eligible++; len(want) < keptPerClaim {
			want = append(want, store.Kept{ID: fmt.Sprintf("c%03d", seq), Turn: 2, Token: int64(1000 + seq)})
		}
	}
	if diff := cmp.Diff(want, d.keptFor(l, 1)); diff != "" {
		t.Errorf("kept named for a claim of one (-want +got):\n%s", diff)
	}
	if got := len(d.keptFor(l, 100)); got != eligible {
		t.Errorf("a claim of 100 names %d, want every one that may wait in the lane (%d)", got, eligible)
	}
}

// TestKeptForNamesATurnBeingStored: a conversation whose answer is being
// stored (its hold still busy) is named with the history that answer
// built, kept before the commit: the commit returns to a whole batch of
// turns at once, and a claim right after it would otherwise read their
// bodies and answers again. A busy hold with an older history (its next
// turn is in flight) is not named.
func TestKeptForNamesATurnBeingStored(t *testing.T) {
	d, _ := admitPair(t, false)
	l := d.lanes[0]
	d.adm.byID = map[string]*heldConv{
		"storing":   {busy: true, turn: 2, hist: &convHistory{turn: 2, seq: 1, token: 7}},
		"in-flight": {busy: true, turn: 3, hist: &convHistory{turn: 2, seq: 2, token: 8}},
	}
	want := []store.Kept{{ID: "storing", Turn: 3, Token: 7}}
	if diff := cmp.Diff(want, d.keptFor(l, 4)); diff != "" {
		t.Errorf("kept named (-want +got):\n%s", diff)
	}
}

// turnRaceStore is the fake store with a race SQLite allows: it hands a
// turn over Kept on the turn alone, without a lease token, and commits a
// turn on its owner and turn. While the commit of h-00's first answer is
// under way (its history kept already, settle), another attempt of that
// turn in the same runner (its lease expired while its request was open,
// the sample claimed again) stores its own answer first (won); the commit
// then fails (ErrWrongTurn), but only once a claim got the next turn.
type turnRaceStore struct {
	*fakeStore
	won         store.Result
	raced       atomic.Bool
	claimedKept chan struct{}
	claimedOnce sync.Once
}

func (s *turnRaceStore) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	return s.ClaimKept(ctx, lane, n, owner, lease, nil)
}

func (s *turnRaceStore) ClaimKept(ctx context.Context, lane string, n int, owner string, lease time.Duration, kept []store.Kept) ([]store.Claimed, error) {
	out, err := s.fakeStore.ClaimKept(ctx, lane, n, owner, lease, kept)
	for _, c := range out {
		if c.ID == "h-00" && c.Turn == 1 && c.Kept && s.raced.Load() {
			s.claimedOnce.Do(func() { close(s.claimedKept) })
		}
	}
	return out, err
}

func (s *turnRaceStore) Commit(ctx context.Context, t store.Transition) error {
	if t.Op != store.OpTurn || t.ID != "h-00" || t.Result.Turn != 0 || !s.raced.CompareAndSwap(false, true) {
		return s.fakeStore.Commit(ctx, t)
	}
	s.mu.Lock()
	x := s.samples["h-00"]
	won := s.won
	won.Lane, won.Attempts = x.Lane, x.attempts+1
	x.prior = append(x.prior, won) // the other attempt's commit
	x.turn++
	x.state, x.owner, x.attempts = store.Pending, "", 0
	s.mu.Unlock()
	select {
	case <-s.claimedKept:
	case <-time.After(time.Minute):
	}
	return fmt.Errorf("%w: the sample is at turn 1", store.ErrWrongTurn)
}

// TestKeptHistoryWaitsForItsCommit: a history is kept before its answer
// is committed, so a claim may hand its next turn over Kept before that
// commit returns; if the commit then fails (another attempt of the turn
// stored its answer first, turnRaceStore), the next turn must not be built
// from the failed attempt's answer: it goes back to the store unspent and
// is sent with the answer the store holds. Built from the kept history, it
// would carry an answer the store does not have.
func TestKeptHistoryWaitsForItsCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", historyBodies(t, 1))
		won := llm.Result{Content: "the other attempt's answer, stored first", FinishReason: "stop"}
		race := &turnRaceStore{fakeStore: st, claimedKept: make(chan struct{}),
			won: store.Result{Response: reply.Encode(won, "http://a", store.Provenance{}), FinishReason: "stop", Endpoint: "http://a"}}
		d, got := runHistories(t, st, func(cfg *Config) { cfg.Store = race })
		select {
		case <-race.claimedKept:
		default:
			t.Fatal("no claim handed h-00's second turn over Kept while its first answer was being stored: the race did not happen")
		}
		x := st.get("h-00")
		if x.state != store.Done {
			t.Fatalf("h-00 %s: %s", x.state, x.reason)
		}
		// The Kept turn went back unspent and came back whole.
		if st.released != 1 || x.prior[1].Attempts != 1 {
			t.Errorf("%d released, the second turn stored at attempt %d; want 1, 1", st.released, x.prior[1].Attempts)
		}
		r := got["h-00/1"]
		if !bytes.Contains(r.body, []byte(won.Content)) || bytes.Contains(r.body, []byte("answer 0 to h-00")) {
			t.Errorf("h-00's second turn was not sent with the store's first answer:\n%s", r.body)
		}
		sentAsStored(t, d, st, got)
	})
}
