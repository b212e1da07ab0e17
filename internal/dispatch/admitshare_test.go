package dispatch

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

func TestAdmitsShare(t *testing.T) {
	for _, tc := range []struct {
		name             string
		pool, warm, need float64
		convs, sharers   int
		want             bool
	}{
		{"alone (0): the whole pool", 10000, 8000, 1000, 3, 0, true},
		{"alone (1): the whole pool", 10000, 8000, 1000, 3, 1, true},
		{"one of two: half the pool", 10000, 4000, 500, 1, 2, true},
		{"one of two: past its half", 10000, 4000, 1000, 1, 2, false},
		{"one of three holding none takes one whatever its size", 10000, 0, 9000, 0, 3, true},
		{"unknown pool, one of three: its part of blindConvs", 0, 1e9, 1e9, blindConvs/3 - 1, 3, true},
		{"unknown pool, one of three: no more", 0, 1, 1, blindConvs / 3, 3, false},
		{"unknown pool, more workers than blindConvs: one each", 0, 1, 1, 1, blindConvs + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := admitsShare(tc.pool, tc.warm+tc.need, tc.convs, tc.sharers); got != tc.want {
				t.Errorf("admitsShare(%v, %v, %v, %d, %d) = %v, want %v", tc.pool, tc.warm, tc.need, tc.convs, tc.sharers, got, tc.want)
			}
		})
	}
}

// An endpoint two workers send to holds, in each, conversations against
// half its pool; when the other worker leaves, the whole pool is this
// one's again and the refused lane tries at once.
func TestSharersSplitThePool(t *testing.T) {
	d, now := admitPair(t, false)
	d.SetSharers(map[string]int{"http://a": 2, "http://elsewhere": 5})
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.lanes[0]
	first := affinity{conv: true, newConv: true}
	held := map[string]int{}
	for i := range 8 {
		e, _ := d.pickLocked(now, l, 3000, first)
		if e == nil {
			break
		}
		d.holdLocked(string(rune('a'+i)), e, 3000, first)
		d.acquireLocked(&call{ep: e, lane: l, est: 3000}, now)
		held[e.url]++
	}
	// 3,000 tokens each: a's half (4,500 of 0.9 x 10,000) takes one, b three.
	if diff := cmp.Diff(map[string]int{"http://a": 1, "http://b": 3}, held); diff != "" {
		t.Errorf("conversations held (-want +got):\n%s", diff)
	}
	if !l.admBlocked {
		t.Fatal("the lane is not refused with both endpoints full")
	}
	d.mu.Unlock()
	d.SetSharers(nil) // the other worker is gone
	d.mu.Lock()
	if l.admBlocked {
		t.Error("the lane stays refused after a's part grew")
	}
	if e, _ := d.pickLocked(now, l, 3000, first); e == nil || e.url != "http://a" {
		t.Errorf("a new conversation went to %v, want a (its whole pool again)", e)
	}
}

// A conversation waiting for its next turn is dropped at once when a
// claim of its lane that began after it started waiting was handed every
// waiting next turn (short, or reaching a first turn) without it: another
// worker has that turn. Anything that leaves that open keeps it.
func TestHoldTakenByAnotherWorkerIsDropped(t *testing.T) {
	next := func(id string) store.Claimed { return store.Claimed{ID: id, Turn: 1} }
	newConv := func(id string) store.Claimed { return store.Claimed{ID: id} }
	for _, tc := range []struct {
		name          string
		alone         bool
		claimedBefore bool // the claim began before the conversation waited
		leasedHere    bool
		otherLane     bool
		n             int
		claimed       []store.Claimed
		dropped       bool
	}{
		{name: "a short claim without it", n: 4, claimed: []store.Claimed{next("x")}, dropped: true},
		{name: "an empty claim", n: 4, dropped: true},
		{name: "a full claim reaching a first turn", n: 2, claimed: []store.Claimed{next("x"), newConv("y")}, dropped: true},
		{name: "a full claim of next turns only: it may come next", n: 2, claimed: []store.Claimed{next("x"), next("y")}},
		{name: "the claim got it", n: 4, claimed: []store.Claimed{next("c")}},
		{name: "the claim began before it waited", claimedBefore: true, n: 4},
		{name: "leased here, waiting for a slot", leasedHere: true, n: 4},
		{name: "its next turn waits in another lane", otherLane: true, n: 4},
		{name: "alone on the endpoint: no other worker", alone: true, n: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, now := admitPair(t, false)
			if !tc.alone {
				d.SetSharers(map[string]int{"http://a": 2})
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			l := d.lanes[0]
			var seq uint64
			if tc.claimedBefore {
				seq = d.claimStartLocked()
			}
			turn := d.holdLocked("c", d.epByURL["http://a"], 3000, affinity{conv: true, newConv: true, turns: 3})
			d.turnDoneLocked("c", turn, true, 3500, llm.Usage{PromptTokens: 3000, CompletionTokens: 500}, now)
			in := l
			if tc.otherLane {
				in = &lane{}
			}
			d.nextTurnInLocked("c", turn, in)
			if tc.leasedHere {
				d.held["c"] = 7
			}
			if !tc.claimedBefore {
				seq = d.claimStartLocked()
			}
			d.dropTakenLocked(l, seq, tc.claimed, tc.n)
			_, held := d.adm.byID["c"]
			if held == tc.dropped {
				t.Errorf("held after the claim: %v, want %v", held, !tc.dropped)
			}
			if tc.dropped && (d.epByURL["http://a"].warm.convs != 0 || d.adm.idle != 0) {
				t.Errorf("dropped, but a holds %d and %d wait idle; want 0, 0", d.epByURL["http://a"].warm.convs, d.adm.idle)
			}
		})
	}
}
