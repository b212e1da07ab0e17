package dispatch

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// chainRun is six samples in lane short (one at a time, max_tokens 100,
// escalating to the auto lane long, max_tokens 1,000) on one endpoint
// whose KV pool is pool tokens; the samples named in truncated run to
// max_tokens and escalate. It returns the order requests started in
// ("short s-00002", "long s-00000").
func chainRun(t *testing.T, pool float64, truncated ...string) []string {
	t.Helper()
	st, tr := newFakeStore(), newTracker()
	st.add("short", "s", 6)
	var mu sync.Mutex
	var started []string
	fn := func(ctx context.Context, c call1) (llm.Result, error) {
		lane := "short"
		if c.req.MaxTokens == 1000 {
			lane = "long"
		}
		mu.Lock()
		started = append(started, lane+" "+c.id)
		mu.Unlock()
		finish := "stop"
		if lane == "short" && slices.Contains(truncated, c.id) {
			finish = "length"
		}
		return generate(ctx, c, 100*time.Millisecond, finish)
	}
	eps, _ := fleet(tr, fn, "http://a")
	cfg := baseConfig(st, eps)
	cfg.Lanes = []LaneConfig{
		{Name: "short", Concurrency: 1, MaxTokens: 100, EscalateTo: "long"},
		{Name: "long", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 1000},
	}
	d := mustNew(t, cfg)
	d.SetCapacity("http://a", pool, CapacityJob)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, id := range truncated {
		if s := st.get(id); s.state != store.Done || s.Lane != "long" {
			t.Errorf("%s: %s in lane %s, want done in long", id, s.state, s.Lane)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return started
}

// TestEscalationsWaitForTheFreshWorkOfTheLaneTheyCameFrom: the escalations
// an auto lane holds (half a pool's worth at full length) wait in the store
// until the lane escalating into it has sent its fresh work, the job's
// possible chain heads; the ones beyond it go at once.
func TestEscalationsWaitForTheFreshWorkOfTheLaneTheyCameFrom(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool float64
		// after: the long request of the first sample starts after the
		// short request of the second.
		after [][2]string
	}{
		// Half the pool holds one long request: of two escalations one
		// is held, until the last short sample was sent; the other goes
		// at once.
		{"one held", 2000, [][2]string{{"long s-00001", "short s-00005"}, {"short s-00003", "long s-00000"}}},
		// Half the pool holds two: both wait.
		{"both held", 4000, [][2]string{{"long s-00000", "short s-00005"}, {"long s-00001", "short s-00005"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				got := chainRun(t, tc.pool, "s-00000", "s-00001")
				for _, pair := range tc.after {
					a, b := slices.Index(got, pair[0]), slices.Index(got, pair[1])
					if a < 0 || b < 0 || a < b {
						t.Errorf("requests started in the order %q: want %q after %q", got, pair[0], pair[1])
					}
				}
			})
		})
	}
}

// Without a known KV pool nothing is held: the escalations go as they
// come.
func TestEscalationsGoAtOnceWithoutAHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		got := chainRun(t, 0, "s-00000", "s-00001")
		if a, b := slices.Index(got, "long s-00001"), slices.Index(got, "short s-00005"); a < 0 || a > b {
			t.Errorf("requests started in the order %q: want the escalation of s-00001 before the last short sample", got)
		}
	})
}

// The hold's conditions, one at a time: an auto lane whose own work ran
// out, escalations put into it, a lane escalating into it that has not
// sent all its fresh work, a known pool. Work put back into that lane
// after it sent its fresh work (a shed's releases) does not hold the
// escalations again.
func TestChainHoldConditions(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fixed       bool // the escalation lane has a fixed limit
		pool        float64
		drained     bool // the escalation lane's own work ran out
		escalated   int
		putBack     int
		source      bool // the short lane's fresh work ran out
		sourceShort bool // and work was put back into it since
		want        int  // held
		claim       int  // of 10 asked
	}{
		{name: "held", pool: 8000, drained: true, escalated: 3, putBack: 5, want: 3, claim: 2},
		{name: "half the pool", pool: 4000, drained: true, escalated: 3, putBack: 5, want: 2, claim: 3},
		{name: "fixed lane", fixed: true, pool: 8000, drained: true, escalated: 3, putBack: 5, claim: 10},
		{name: "unknown pool", drained: true, escalated: 3, putBack: 5, claim: 10},
		{name: "own work left", pool: 8000, escalated: 3, putBack: 5, claim: 10},
		{name: "no escalation", pool: 8000, drained: true, putBack: 5, claim: 10},
		{name: "fresh work sent", pool: 8000, drained: true, escalated: 3, putBack: 5, source: true, claim: 10},
		{name: "put back after", pool: 8000, drained: true, escalated: 3, putBack: 5, source: true, sourceShort: true, claim: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			long := LaneConfig{Name: "long", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 1000}
			if tc.fixed {
				long = LaneConfig{Name: "long", Concurrency: 4, MaxTokens: 1000}
			}
			d := oneEndpoint(t, LaneConfig{Name: "short", Concurrency: 4, MaxTokens: 100, EscalateTo: "long"}, long)
			d.SetCapacity("http://a", tc.pool, CapacityJob)
			short, l := d.lanes[0], d.lanes[1]
			short.chain.drained = tc.source
			short.short = tc.source && !tc.sourceShort
			l.chain = chainState{drained: tc.drained, putBack: tc.putBack, escalated: tc.escalated}
			d.mu.Lock()
			held, claim := d.chainHoldLocked(l), d.chainCapLocked(l, 10)
			d.mu.Unlock()
			if held != tc.want || claim != tc.claim {
				t.Errorf("held %d, claims %d of 10; want %d and %d", held, claim, tc.want, tc.claim)
			}
		})
	}
}

// A truncated turn with more of its conversation after it heads a chain
// of its own: its escalation is never held; the last turn's, or a plain
// prompt's, may be.
func TestEscalatedTurnThatGoesOnIsNotHeld(t *testing.T) {
	p, err := conversation.Decode([]byte(chat3("c")))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		t    *turn
		want bool
	}{
		{"first of three", &turn{index: 0, plan: p}, true},
		{"second of three", &turn{index: 1, plan: p}, true},
		{"last", &turn{index: 2, plan: p}, false},
		{"no turn", nil, false},
	} {
		v := escalation(tc.t)
		if v.out != outEscalate || v.goesOn != tc.want {
			t.Errorf("%s: verdict %v, goes on %v; want an escalation, goes on %v", tc.name, v.out, v.goesOn, tc.want)
		}
		// Counted into a drained escalation lane: put back, and held only
		// when it does not go on.
		d := oneEndpoint(t, LaneConfig{Name: "short", Concurrency: 4, MaxTokens: 100, EscalateTo: "long"},
			LaneConfig{Name: "long", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 1000})
		short, long := d.lanes[0], d.lanes[1]
		long.chain.drained = true
		d.mu.Lock()
		d.count(v, llm.Result{}, short, long)
		d.mu.Unlock()
		if held := long.chain.escalated == 1; long.chain.putBack != 1 || held == tc.want {
			t.Errorf("%s: counted %d put back, %d escalations to hold; want 1 and %d", tc.name, long.chain.putBack, long.chain.escalated, map[bool]int{true: 0, false: 1}[tc.want])
		}
	}
}
