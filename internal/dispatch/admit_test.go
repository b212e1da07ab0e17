package dispatch

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

func TestAdmits(t *testing.T) {
	for _, tc := range []struct {
		name             string
		pool, warm, need float64
		convs            int
		want             bool
	}{
		{"unknown pool: a few", 0, 1e9, 1e9, blindConvs - 1, true},
		{"unknown pool: no more", 0, 1, 1, blindConvs, false},
		{"an endpoint holding none takes one whatever its size", 100000, 0, 200000, 0, true},
		{"within the warm share", 100000, 80000, 10000, 20, true},
		{"exactly at the warm share", 100000, 80000, 100000*warmShare - 80000, 20, true},
		{"past the warm share", 100000, 85000, 100000*warmShare - 85000 + 1, 20, false},
		{"a held pool already over its share takes no new one", 100000, 120000, 1, 30, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := admits(tc.pool, tc.warm+tc.need, tc.convs); got != tc.want {
				t.Errorf("admits(%v, %v + %v, %d) = %v, want %v", tc.pool, tc.warm, tc.need, tc.convs, got, tc.want)
			}
		})
	}
}

// A shared prefix counts once per endpoint however many held
// conversations share it, and leaves with the last of them.
func TestWarmSetCountsASharedPrefixOnce(t *testing.T) {
	var w warmSet
	a := &heldConv{own: 1000, prefix: 7, prefixTok: 3000}
	b := &heldConv{own: 500, prefix: 7, prefixTok: 3000}
	c := &heldConv{own: 200} // no prefix worth steering
	type step struct {
		tokens   float64
		need     float64 // of a new conversation of 1,000 own tokens on prefix 7 (3,000)
		needNone float64 // of one of 4,000 tokens without a prefix
	}
	var got []step
	look := func() {
		got = append(got, step{w.tokens, w.need(1000, 7, 3000), w.need(4000, 0, 0)})
	}
	look()
	w.add(a)
	look()
	w.add(b)
	w.add(c)
	look()
	w.remove(a)
	look()
	w.remove(b)
	look()
	want := []step{
		{0, 4000, 4000},
		{4000, 1000, 4000}, // the prefix is held: a newcomer on it brings only its own part
		{4700, 1000, 4000}, // b's 500 and c's 200; the prefix once
		{3700, 1000, 4000}, // b still holds the prefix
		{200, 4000, 4000},  // the last on prefix 7 took it along
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(step{})); diff != "" {
		t.Errorf("warm set (-want +got):\n%s", diff)
	}
	if w.convs != 1 || len(w.prefixes) != 0 {
		t.Errorf("convs %d, prefixes %v; want 1 and none", w.convs, w.prefixes)
	}
}

// admitPair is autoPair with pools of 10,000 tokens and limits of 100, so
// admission, not the limits, decides.
func admitPair(t *testing.T, noAdmission bool) (*Dispatcher, time.Time) {
	t.Helper()
	m := engine.Metrics{Running: 0, Queued: 0, TokenUsage: 0.1}
	d, now := autoPair(t, 100, &m)
	d.cfg.NoAdmission = noAdmission
	m.MaxTotalTokens = 10000
	m.Present = engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldMaxTotalTokens
	d.Observe("http://a", m, now)
	d.Observe("http://b", m, now)
	for _, e := range d.eps {
		e.warm.scale = 1 // the pool as it is, not startScale
	}
	return d, now
}

// New conversations fill each endpoint up to the warm share of its pool
// and are then refused; a held conversation's next turn is always taken,
// on its endpoint; a single-turn sample is not a conversation and is not
// held back. When a conversation ends, its room takes a new one.
func TestAdmissionHoldsConversationsTheirPoolKeepsWarm(t *testing.T) {
	d, now := admitPair(t, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.lanes[0]
	start := func(id string, est float64, a affinity) string {
		e, _ := d.pickLocked(now, l, est, a)
		if e == nil {
			return "-"
		}
		d.holdLocked(id, e, est, a)
		d.acquireLocked(&call{ep: e, lane: l, est: est}, now)
		return e.url
	}
	first := affinity{conv: true, newConv: true}
	var got []string
	// 3,000 tokens each: three fit in 9,000 (0.9 of 10,000) per endpoint.
	for i := range 6 {
		got = append(got, start(string(rune('a'+i)), 3000, first))
	}
	got = append(got, start("g", 3000, first))                                  // refused: both full
	got = append(got, start("a", 3000, affinity{conv: true, prev: "http://a"})) // a's next turn: taken
	got = append(got, start("single", 3000, affinity{}))                        // not a conversation: taken
	blocked := l.admBlocked
	d.turnDoneLocked("b", d.adm.byID["b"], false, 0, llm.Usage{}, now) // b's last turn answered: it leaves
	got = append(got, start("h", 3000, first))
	want := []string{"http://a", "http://b", "http://a", "http://b", "http://a", "http://b", "-", "http://a", "http://b", "http://b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("placements (-want +got):\n%s", diff)
	}
	if !blocked || l.admBlocked {
		t.Errorf("blocked %v after the refusal and %v after a conversation left; want true, false", blocked, l.admBlocked)
	}
	if n := len(d.adm.byID); n != 6 {
		t.Errorf("%d conversations held, want 6 (a, c, d, e, f, h)", n)
	}
}

// With admission off (balance: affinity-only) new conversations go
// wherever there is room.
func TestNoAdmissionTakesEveryNewConversation(t *testing.T) {
	d, now := admitPair(t, true)
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range 10 {
		e, _ := d.pickLocked(now, d.lanes[0], 3000, affinity{conv: true, newConv: true})
		if e == nil {
			t.Fatalf("conversation %d refused with admission off", i)
		}
		d.holdLocked("x", e, 3000, affinity{conv: true, newConv: true})
		d.acquireLocked(&call{ep: e, lane: d.lanes[0], est: 3000}, now)
	}
	if len(d.adm.byID) != 0 {
		t.Errorf("%d conversations held with admission off, want none", len(d.adm.byID))
	}
}

// Between turns a held conversation's footprint is its last prompt and
// answer as the server counted them; it moves with a next turn sent to
// another endpoint; the claim is capped at the conversations waiting for
// their next turn while admission refuses, and idle ones expire.
func TestHeldConversationLifecycle(t *testing.T) {
	d, now := admitPair(t, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	a, b := d.epByURL["http://a"], d.epByURL["http://b"]
	conv := affinity{conv: true, newConv: true, prefix: 9, prefixTok: 1000}
	d.holdLocked("c1", a, 2500, conv)
	d.holdLocked("c2", a, 2000, conv)
	if a.warm.tokens != 1500+1000+1000 {
		t.Errorf("a warm %v, want 3500 (1,500 and 1,000 own, the prefix once)", a.warm.tokens)
	}
	d.turnDoneLocked("c1", d.adm.byID["c1"], true, 4000, llm.Usage{}, now) // prompt and answer as counted: 4,000
	if a.warm.tokens != 3000+1000+1000 || d.adm.idle != 1 {
		t.Errorf("after c1's turn: a warm %v, idle %d; want 5000, 1", a.warm.tokens, d.adm.idle)
	}
	d.lanes[0].admBlocked = true
	if n := d.claimCapLocked(d.lanes[0], 50); n != 1 {
		t.Errorf("claim capped at %d while blocked, want 1 (c1 waits for its next turn)", n)
	}
	d.holdLocked("c1", b, 4500, affinity{conv: true, prev: "http://a", prefix: 9, prefixTok: 1000})
	// It keeps the context its answer's usage set (3,000 own), not the
	// stale first-turn estimate a next turn's claim carries.
	if a.warm.tokens != 2000 || b.warm.tokens != 4000 || d.adm.idle != 0 {
		t.Errorf("after c1 moved to b: a %v, b %v, idle %d; want 2000, 4000, 0", a.warm.tokens, b.warm.tokens, d.adm.idle)
	}
	d.turnDoneLocked("c2", d.adm.byID["c2"], true, 2500, llm.Usage{}, now)
	d.expireLocked(now.Add(heldIdle - time.Second))
	if _, ok := d.adm.byID["c2"]; !ok {
		t.Fatal("c2 expired before heldIdle")
	}
	d.expireLocked(now.Add(heldIdle + heldIdle/16)) // expiry runs at most every heldIdle/16
	if _, ok := d.adm.byID["c2"]; ok || a.warm.convs != 0 || a.warm.tokens != 0 || d.adm.idle != 0 {
		t.Errorf("after heldIdle: c2 held %v, a convs %d tokens %v, idle %d; want dropped, 0, 0, 0", ok, a.warm.convs, a.warm.tokens, d.adm.idle)
	}
	if _, ok := d.adm.byID["c1"]; !ok {
		t.Error("c1, busy on b, expired")
	}
}

func TestPriorityFor(t *testing.T) {
	p := func(n int) *int { return &n }
	for _, tc := range []struct {
		name  string
		s     *Server
		later bool
		want  *int
	}{
		{"server unknown", nil, true, nil},
		{"no priority scheduling", &Server{}, true, nil},
		{"SGLang, higher first: a next turn", &Server{Priority: 1}, true, p(1)},
		{"SGLang, higher first: a first turn", &Server{Priority: 1}, false, p(0)},
		{"lower first (vLLM): a next turn", &Server{Priority: -1}, true, p(-1)},
		{"lower first (vLLM): a first turn", &Server{Priority: -1}, false, p(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, priorityFor(tc.s, tc.later)); diff != "" {
				t.Errorf("priority (-want +got):\n%s", diff)
			}
		})
	}
}

// A new conversation is admitted when the held ones and it fit the warm
// share at their peak in the turns to come, each growing at its own rate
// until its last turn. Conversations at every stage peak about a turn
// above what they hold now, since the oldest end as the others grow:
// eight of ten turns at 2..9 turns done (100 tokens a turn) and a
// newcomer of 200 peak at 5,600 a turn from now, within 9,000 (each
// counted at its last turn's size they were 10,000, refused). Eight
// admitted together grow together: at their last turn they and the
// newcomer hold 10,000, refused.
func TestAdmissionCountsThePeakAhead(t *testing.T) {
	for _, tc := range []struct {
		name string
		done []int
		want bool
	}{
		{"conversations at every stage", []int{2, 3, 4, 5, 6, 7, 8, 9}, true},
		{"a cohort at its first turn", []int{1, 1, 1, 1, 1, 1, 1, 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := admitPair(t, false)
			d.mu.Lock()
			defer d.mu.Unlock()
			a := d.epByURL["http://a"]
			for _, done := range tc.done {
				a.warm.add(&heldConv{ep: a, own: 100 * float64(done), done: done, turns: 10})
			}
			if got := d.admitsLocked(a, 200, affinity{conv: true, newConv: true, turns: 10}); got != tc.want {
				t.Errorf("admits a newcomer of 200 tokens = %v, want %v (peak %v of 9,000)", got, tc.want, a.warm.peakWith(200, 1, 10, 0, 0))
			}
		})
	}
}

// Next turns sent back to their endpoint move its scale: a window with
// none losing its history raises it, one with more than a twentieth lost
// lowers it, within bounds; a server that reports no cached tokens is not
// judged at all.
func TestWarmScaleFollowsWhatNextTurnsFound(t *testing.T) {
	window := func(w *warmSet, lost int) {
		for i := range judgeWindow {
			w.judge(i >= lost)
		}
	}
	var w warmSet
	if w.scaleOr1() != startScale { // nothing judged yet
		t.Errorf("scale before any judgement %v, want %v", w.scaleOr1(), startScale)
	}
	window(&w, 0)
	if w.scaleOr1() != maxScale {
		t.Errorf("scale after a clean window %v, want it kept at the cap %v", w.scaleOr1(), maxScale)
	}
	window(&w, 4)
	if want := startScale * scaleDown; math.Abs(w.scaleOr1()-want) > 1e-9 {
		t.Errorf("scale after 4 losses %v, want %v", w.scaleOr1(), want)
	}
	window(&w, 1) // 1 of 32: within the lost share
	if want := startScale * scaleDown; math.Abs(w.scaleOr1()-want) > 1e-9 {
		t.Errorf("scale after one loss in a window %v, want it kept at %v", w.scaleOr1(), want)
	}
	window(&w, 0)
	if want := min(startScale*scaleDown*scaleUp, maxScale); math.Abs(w.scaleOr1()-want) > 1e-9 {
		t.Errorf("scale after a clean window %v, want %v", w.scaleOr1(), want)
	}
	for range 40 {
		window(&w, 32)
	}
	if w.scaleOr1() != minScale {
		t.Errorf("scale after many lossy windows %v, want the floor %v", w.scaleOr1(), minScale)
	}
	for range 40 {
		window(&w, 0)
	}
	if w.scaleOr1() != maxScale {
		t.Errorf("scale after many clean windows %v, want the cap %v", w.scaleOr1(), maxScale)
	}

	// Through the dispatcher: judged only once the server reported a
	// cached token, and only for a turn back on the same endpoint.
	d, now := admitPair(t, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.epByURL["http://a"]
	conv := affinity{conv: true, newConv: true}
	later := affinity{conv: true, prev: "http://a"}
	d.holdLocked("c", a, 1000, conv)
	d.turnDoneLocked("c", d.adm.byID["c"], true, 1200, llm.Usage{PromptTokens: 1000, CompletionTokens: 200}, now)
	d.holdLocked("c", a, 1300, later)
	d.turnDoneLocked("c", d.adm.byID["c"], true, 1500, llm.Usage{PromptTokens: 1300, CompletionTokens: 200}, now) // reports nothing cached
	if a.warm.judged != 0 {
		t.Errorf("%d turns judged on a server that reported no cached tokens, want 0", a.warm.judged)
	}
	d.holdLocked("c", a, 1600, later)
	d.turnDoneLocked("c", d.adm.byID["c"], true, 1800, llm.Usage{PromptTokens: 1600, CompletionTokens: 200, CachedTokens: 1300}, now) // found all of 1,300
	d.holdLocked("c", a, 1900, later)
	d.turnDoneLocked("c", d.adm.byID["c"], true, 2100, llm.Usage{PromptTokens: 1900, CompletionTokens: 200, CachedTokens: 500}, now) // lost its history
	if a.warm.judged != 2 || a.warm.lost != 1 {
		t.Errorf("judged %d, lost %d; want 2 and 1", a.warm.judged, a.warm.lost)
	}
}

// When admission holds new conversations back, the room a conversation
// leaves on an endpoint goes to a new conversation whose prefix is homed
// there, though one homed on a full endpoint comes first in the queue;
// only with none homed there does another spill to it.
func TestAdmittedRoomGoesToItsPrefixes(t *testing.T) {
	const a, b = "http://a", "http://b"
	onA, onB := keyHomedOn(a, a, b), keyHomedOn(b, a, b)
	newConv := func(id string, key uint64) waiting {
		// 2,900 prompt tokens and the lane's 100: the 3,000 start counts them at.
		return waiting{c: store.Claimed{ID: id, PromptTokens: 2900}, a: affinity{prefix: key, conv: true, newConv: true}}
	}
	for _, tc := range []struct {
		name  string
		queue []waiting
		sent  []string
	}{
		{"one homed on a waits; one homed on b takes b's room", []waiting{newConv("A1", onA), newConv("B1", onB)}, []string{"B1@" + b}},
		{"none homed on b: the first spills there", []waiting{newConv("A1", onA), newConv("A2", onA)}, []string{"A1@" + b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, now := admitPair(t, false)
			l := d.lanes[0]
			d.mu.Lock()
			// a holds 3 conversations of 3,000 tokens: full at warmShare of
			// 10,000; b holds 2: room for one more.
			for i, ep := range []string{a, a, a, b, b} {
				d.holdLocked(fmt.Sprint("held", i), d.epByURL[ep], 3000, affinity{conv: true, newConv: true})
			}
			d.mu.Unlock()
			var sent []string
			start := func(w waiting) bool {
				d.mu.Lock()
				defer d.mu.Unlock()
				e, _ := d.pickLocked(now, l, 3000, w.a)
				if e == nil {
					return false
				}
				d.holdLocked(w.c.ID, e, 3000, w.a)
				d.acquireLocked(&call{ep: e, lane: l, est: 3000}, now)
				sent = append(sent, w.c.ID+"@"+e.url)
				return true
			}
			d.sendQueue(l, tc.queue, 10, start)
			if diff := cmp.Diff(tc.sent, sent); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
		})
	}
}

// While admission refuses new conversations of one lane, a lane of
// single-turn samples is claimed and sent as before: the claim cap and the
// refusal of first turns belong to the lane whose conversation was refused
// (they were global: the other lane's claims were capped at the
// conversations waiting for a next turn, none here, so it got nothing).
func TestAdmissionLeavesOtherLanesUncapped(t *testing.T) {
	st := newFakeStore()
	st.add("single", "s", 4)
	hang := func(ctx context.Context, c call1) (llm.Result, error) {
		<-ctx.Done()
		return llm.Result{}, ctx.Err()
	}
	eps, _ := fleet(newTracker(), hang, "http://a", "http://b")
	cfg := baseConfig(st, eps)
	cfg.Lanes = []LaneConfig{{Name: "conv", Concurrency: 100, MaxTokens: 100}, {Name: "single", Concurrency: 100, MaxTokens: 100}}
	d := mustNew(t, cfg)
	now := d.now()
	m := engine.Metrics{TokenUsage: 0.1, MaxTotalTokens: 10000,
		Present: engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldMaxTotalTokens}
	d.Observe("http://a", m, now)
	d.Observe("http://b", m, now)
	conv := d.lanes[0]
	first := affinity{conv: true, newConv: true}
	d.mu.Lock()
	for _, id := range []string{"c1", "c2"} { // one conversation fills each pool
		e, _ := d.pickLocked(now, conv, 9000, first)
		if e == nil {
			d.mu.Unlock()
			t.Fatalf("conversation %s refused on empty endpoints", id)
		}
		d.holdLocked(id, e, 9000, first)
	}
	e, _ := d.pickLocked(now, conv, 9000, first)
	refused := d.adm.refusedNew
	d.mu.Unlock()
	if e != nil || refused != 1 {
		t.Fatalf("third conversation went to %v (refused %d); want refused", e, refused)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		d.workers.Wait()
	}()
	started, _, _, err := d.claimLane(ctx, ctx, context.Background(), d.lanes[1])
	if err != nil || started != 4 {
		t.Errorf("single-turn lane started %d (err %v) while the conversation lane was refused, want 4", started, err)
	}
}

// A conversation whose turns are answered by backups (hedge.go) leaves
// admission when it ends: settleFromHedge did not tell admission, so a
// conversation ended by a backup stayed held, busy, for the rest of the
// run, its tokens counted against its endpoint's pool for good (with
// enough of them no endpoint admitted a new conversation, and the claim,
// capped at the idle held ones, none, stopped).
func TestConversationAnsweredByBackupsLeavesAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		turn := 0
		r := &backupRun{
			bodies: map[string]string{"c": chat3("c")},
			shortEnd: func() (llm.Result, error) { // the last turn is cut: its backup's answer ends the conversation
				if turn++; turn < 3 {
					return answer("fits", "stop", 50), nil
				}
				return answer("cut", "length", 100), nil
			},
			long: func(ctx context.Context, n int) (llm.Result, error) {
				time.Sleep(500 * time.Millisecond) // outlives the short request
				return answer("the long answer", "stop", 400), nil
			},
		}
		d := r.run(t)
		if s := r.st.get("c"); s.state != store.Done {
			t.Fatalf("conversation %s, want done", s.state)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if n, convs := len(d.adm.byID), d.epByURL["http://a"].warm.convs; n != 0 || convs != 0 {
			t.Errorf("after Run: %d conversations held, endpoint holds %d; want none", n, convs)
		}
	})
}

// A settle commits the next turn pending before it takes d.mu to tell
// admission; a claim in between starts the next turn first. The late
// settle must not mark the conversation idle while that turn runs: it was
// counted among the conversations waiting for a next turn (the claim cap)
// and dropped by expiry after heldIdle, busy, its tokens left off the pool.
func TestLateSettleLeavesTheNextTurnsHold(t *testing.T) {
	d, now := admitPair(t, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.epByURL["http://a"]
	turn0 := d.holdLocked("c", a, 3000, affinity{conv: true, newConv: true, turns: 3})
	turn1 := d.holdLocked("c", a, 3000, affinity{conv: true, prev: "http://a", turn: 1, turns: 3}) // claimed before turn 0's settle told admission
	d.turnDoneLocked("c", turn0, true, 4000, llm.Usage{PromptTokens: 3500, CompletionTokens: 500}, now)
	if d.adm.idle != 0 || !turn1.busy {
		t.Errorf("after turn 0's late settle: idle %d, turn 1 busy %v; want 0, true", d.adm.idle, turn1.busy)
	}
	d.expireLocked(now.Add(2 * heldIdle))
	if d.adm.byID["c"] != turn1 || a.warm.convs != 1 {
		t.Errorf("conversation held %v (a holds %d), want turn 1's hold, 1", d.adm.byID["c"] != nil, a.warm.convs)
	}
	d.turnDoneLocked("c", turn1, false, 0, llm.Usage{}, now)
	if len(d.adm.byID) != 0 || a.warm.convs != 0 || d.adm.idle != 0 {
		t.Errorf("after the last turn: %d held, a holds %d, idle %d; want none", len(d.adm.byID), a.warm.convs, d.adm.idle)
	}
}

// Under admission a held conversation's next turn goes only to the
// endpoint of the turn before: there although it is clearly more loaded,
// nowhere (it waits) when that one is past its limit and return allowance,
// elsewhere only once it is paused (down, draining). With admission off
// (balance: affinity-only) it leaves a busy or full endpoint as before.
func TestNextTurnWaitsForItsEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name        string
		noAdmission bool
		want        []string
	}{
		{"admission", false, []string{"http://a", "-", "http://b"}},
		{"affinity only", true, []string{"http://b", "http://b", "http://b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, now := admitPair(t, tc.noAdmission)
			d.mu.Lock()
			defer d.mu.Unlock()
			a, l := d.epByURL["http://a"], d.lanes[0]
			place := func() string {
				e, _ := d.pickLocked(now, l, 1000, affinity{conv: true, prev: "http://a"})
				if e == nil {
					return "-"
				}
				return e.url
			}
			a.load.committed = 8000 // a 0.9 full after the turn, b 0.1: clearly more loaded
			got := []string{place()}
			el := &a.lanes[0]
			el.inflight, el.over = el.ctl.Limit(), max(1, el.ctl.Limit()/10)
			got = append(got, place())
			a.paused = true
			got = append(got, place())
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("placements: busy, full, paused (-want +got):\n%s", diff)
			}
		})
	}
}

// A claim whose samples are next turns pinned to their full endpoint
// starts none of them, and the claim loop is not told to claim again at
// once: the store hands those same next turns out first, so it would
// claim and release them in a loop while the other endpoint idled.
func TestPinnedNextTurnsDoNotSpinTheClaim(t *testing.T) {
	st := newFakeStore()
	st.add("short", "c", 200)
	st.mu.Lock()
	for id, x := range st.samples {
		x.Body = []byte(chat3(id))
		x.turn = 1
		x.prior = []store.Result{{Turn: 0, Endpoint: "http://a", PromptTokens: 100, CompletionTokens: 50}}
	}
	st.mu.Unlock()
	hang := func(ctx context.Context, c call1) (llm.Result, error) {
		<-ctx.Done()
		return llm.Result{}, ctx.Err()
	}
	eps, _ := fleet(newTracker(), hang, "http://a", "http://b")
	cfg := baseConfig(st, eps)
	cfg.Lanes = []LaneConfig{{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 100}}
	d := mustNew(t, cfg)
	m := engine.Metrics{TokenUsage: 0.1, MaxTotalTokens: 200000,
		Present: engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldMaxTotalTokens}
	now := d.now()
	d.Observe("http://a", m, now)
	d.Observe("http://b", m, now)
	d.mu.Lock()
	el := &d.epByURL["http://a"].lanes[0] // a at its limit, its return allowance used
	el.inflight, el.over = el.ctl.Limit(), max(1, el.ctl.Limit()/10)
	d.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		d.workers.Wait()
	}()
	for round := range 3 {
		started, more, _, err := d.claimLane(ctx, ctx, context.Background(), d.lanes[0])
		if err != nil {
			t.Fatal(err)
		}
		if started != 0 || more {
			t.Fatalf("round %d: started %d, claim again at once %v; want 0 started (every turn is pinned to a full a) and no immediate claim", round, started, more)
		}
	}
}

// A next turn held anew (its hold was dropped, or the runner restarted)
// counts at the context of the turn before, as the store keeps it, not at
// the first turn's prompt estimate the sample carries.
func TestReheldNextTurnCountsItsContext(t *testing.T) {
	d, _ := admitPair(t, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.epByURL["http://a"]
	h := d.holdLocked("c", e, 1000, affinity{conv: true, prev: "http://a", prevCtx: 6000, turn: 2, turns: 4})
	if h.own != 6000 || h.done != 2 {
		t.Errorf("re-held at own %v after %d turns, want 6000 after 2", h.own, h.done)
	}
	first := d.holdLocked("f", e, 1000, affinity{conv: true, newConv: true, turns: 4})
	if first.own != 1000 || first.done != 1 {
		t.Errorf("first turn held at own %v after %d turns, want its estimate 1000 after 1", first.own, first.done)
	}
}

// Expiry drops a conversation idle for heldIdle, but not one whose next
// turn this worker has claimed and keeps waiting for its endpoint.
func TestExpirySparesANextTurnClaimedHere(t *testing.T) {
	d, now := admitPair(t, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.epByURL["http://a"]
	a := affinity{conv: true, newConv: true, turns: 4}
	for _, id := range []string{"waiting", "gone"} {
		h := d.holdLocked(id, e, 1000, a)
		d.turnDoneLocked(id, h, true, 1500, llm.Usage{}, now)
	}
	d.held["waiting"] = 7
	d.expireLocked(now.Add(heldIdle + time.Second))
	if _, ok := d.adm.byID["waiting"]; !ok {
		t.Error("a conversation whose next turn is claimed here was dropped")
	}
	if _, ok := d.adm.byID["gone"]; ok {
		t.Error("a conversation idle for heldIdle with no next turn here was kept")
	}
}
