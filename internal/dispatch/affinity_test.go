package dispatch

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/store"
)

// homeOf is the endpoint the rendezvous order puts first for key.
func homeOf(key uint64, urls ...string) string {
	best, bw := "", uint64(0)
	for _, u := range urls {
		if w := rendezvous(key, u); best == "" || w > bw {
			best, bw = u, w
		}
	}
	return best
}

// secondOf is the endpoint the rendezvous order puts second for key.
func secondOf(key uint64, urls ...string) string {
	home := homeOf(key, urls...)
	var rest []string
	for _, u := range urls {
		if u != home {
			rest = append(rest, u)
		}
	}
	return homeOf(key, rest...)
}

func TestAffinityRule(t *testing.T) {
	const key = 42
	urls := []string{"a", "b", "c"}
	home, second := homeOf(key, urls...), secondOf(key, urls...)
	loads := func(byURL map[string]float64) []candidate {
		var cs []candidate
		for _, u := range urls {
			if l, ok := byURL[u]; ok {
				cs = append(cs, candidate{url: u, load: l, closed: true})
			}
		}
		return cs
	}
	tests := []struct {
		name     string
		cands    []candidate
		a        affinity
		byTokens bool
		want     string
	}{
		{"no affinity: least loaded", loads(map[string]float64{"a": 0.5, "b": 0.2, "c": 0.3}), affinity{}, true, "b"},
		{"no affinity: ties go to the first in round-robin order", loads(map[string]float64{"a": 0.2, "b": 0.2, "c": 0.2}), affinity{}, true, "a"},
		{"next turn stays on its endpoint", loads(map[string]float64{"a": 0.3, "b": 0.2, "c": 0.3}), affinity{prev: "a"}, true, "a"},
		{"within the absolute margin (0.15 of the pool)", loads(map[string]float64{"a": 0.14, "b": 0.01}), affinity{prev: "a"}, true, "a"},
		{"within the ratio (1.5x)", loads(map[string]float64{"a": 0.6, "b": 0.41}), affinity{prev: "a"}, true, "a"},
		{"clearly more loaded: both margins exceeded", loads(map[string]float64{"a": 0.7, "b": 0.4}), affinity{prev: "a"}, true, "b"},
		{"by requests while a pool is unknown: 4 more is within", loads(map[string]float64{"a": 10, "b": 6}), affinity{prev: "a"}, false, "a"},
		{"by requests: 5 more and 1.5x is clearly more", loads(map[string]float64{"a": 11, "b": 6}), affinity{prev: "a"}, false, "b"},
		{"previous endpoint without room (down, paused, full) is not a candidate", loads(map[string]float64{"b": 0.5, "c": 0.3}), affinity{prev: "a"}, true, "c"},
		{"previous endpoint with a half-open breaker is not kept",
			[]candidate{{url: "a", load: 0.2}, {url: "b", load: 0.1, closed: true}, {url: "c", load: 0.15, closed: true}}, affinity{prev: "a"}, true, "b"},
		{"first turn goes to its prefix's home", loads(map[string]float64{"a": 0.3, "b": 0.3, "c": 0.3}), affinity{prefix: key}, true, home},
		{"prefix home clearly more loaded: the next in its order",
			loads(map[string]float64{home: 0.9, second: 0.3, other(urls, home, second): 0.2}), affinity{prefix: key}, true, second},
		{"a new conversation under admission stays on its prefix's home however loaded",
			loads(map[string]float64{home: 0.9, second: 0.3, other(urls, home, second): 0.2}), affinity{prefix: key, conv: true, newConv: true, admitted: true}, true, home},
		{"a later turn whose endpoint is busy falls back to its prefix order",
			loads(map[string]float64{"a": 0.9, "b": 0.3, "c": 0.3}), affinity{prev: "a", prefix: key}, true, prefixPick(key, "a", urls)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			i := choose(tc.cands, tc.a, tc.byTokens)
			if i < 0 || tc.cands[i].url != tc.want {
				t.Errorf("choose = %d (%v); want %s", i, tc.cands, tc.want)
			}
		})
	}
	if i := choose(nil, affinity{prev: "a"}, true); i != -1 {
		t.Errorf("choose with no candidate = %d; want -1", i)
	}
}

func other(urls []string, not ...string) string {
	for _, u := range urls {
		if !strings.Contains(strings.Join(not, " "), u) {
			return u
		}
	}
	return ""
}

// prefixPick is the prefix order's first endpoint other than busy.
func prefixPick(key uint64, busy string, urls []string) string {
	if h := homeOf(key, urls...); h != busy {
		return h
	}
	return secondOf(key, urls...)
}

// TestPrefixSpreads checks that prefix homes spread over the endpoints:
// each of 4 endpoints is home to a fair share of 400 prefixes.
func TestPrefixSpreads(t *testing.T) {
	urls := []string{"http://127.0.0.1:30000", "http://127.0.0.1:30001", "http://127.0.0.1:30002", "http://127.0.0.1:30003"}
	n := map[string]int{}
	for k := range 400 {
		n[homeOf(uint64(k)*0x9e3779b97f4a7c15+1, urls...)]++
	}
	for _, u := range urls {
		if n[u] < 70 || n[u] > 130 {
			t.Errorf("%s is home to %d of 400 prefixes; want about 100", u, n[u])
		}
	}
}

func TestAffinityOf(t *testing.T) {
	long := strings.Repeat("x", prefixMinBytes)
	body := func(system string) []byte {
		return []byte(fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, system))
	}
	a := affinityOf(store.Claimed{Body: body(long), Turn: 2, Prior: []store.Result{{Endpoint: "x"}, {Endpoint: "y"}}})
	b := affinityOf(store.Claimed{Body: body(long)})
	if a.prev != "y" || a.prefix == 0 || a.prefix != b.prefix || b.prev != "" {
		t.Errorf("affinityOf = %+v and %+v; want prev y and none, the same non-zero prefix", a, b)
	}
	if c := affinityOf(store.Claimed{Body: body("short")}); c.prefix != 0 {
		t.Errorf("a %d-byte system prompt got prefix %x; want none under %d bytes", len("short"), c.prefix, prefixMinBytes)
	}
	if c := affinityOf(store.Claimed{Body: body(long + "y")}); c.prefix == a.prefix {
		t.Errorf("different system prompts share prefix %x", c.prefix)
	}
}

// TestStartHold checks the start hold: endpoints paused at start, claims
// wait after the first is resumed until every one is, or startGrace.
func TestStartHold(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "a", "b")
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name       string
		noAffinity bool
		resume     []string
		at         time.Duration // after the first resume
		want       bool
	}{
		{"nothing resumed yet: no endpoint can take work anyway", false, nil, 0, false},
		{"one of two resumed", false, []string{"a"}, time.Second, true},
		{"both resumed", false, []string{"a", "b"}, time.Second, false},
		{"the other still down after the grace", false, []string{"a"}, startGrace, false},
		{"affinity off", true, []string{"a"}, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(newFakeStore(), eps)
			cfg.NoAffinity = tc.noAffinity
			cfg.Now = func() time.Time { return now }
			d := mustNew(t, cfg)
			d.Pause("a", "starting")
			d.Pause("b", "starting")
			for _, u := range tc.resume {
				d.Resume(u)
			}
			d.mu.Lock()
			_, hold := d.startHoldLocked(now.Add(tc.at))
			d.mu.Unlock()
			if hold != tc.want {
				t.Errorf("hold = %v, want %v", hold, tc.want)
			}
		})
	}
}

// autoPair is a dispatcher on http://a and http://b with one auto lane at
// limit initial, both endpoints probed once with m (completed with a
// 200,000-token pool and the fields present):
// the next probe ends an interval.
func autoPair(t *testing.T, initial int, m *engine.Metrics) (*Dispatcher, time.Time) {
	t.Helper()
	eps, _ := fleet(newTracker(), ok(time.Second), "http://a", "http://b")
	cfg := baseConfig(newFakeStore(), eps)
	cfg.Lanes = []LaneConfig{{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: initial}, MaxTokens: 100}}
	d := mustNew(t, cfg)
	now := time.Unix(1000, 0)
	m.MaxTotalTokens = 200000
	m.Present = engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldMaxTotalTokens
	d.Observe("http://a", *m, now)
	d.Observe("http://b", *m, now)
	return d, now
}

// An endpoint whose requests mostly came for a prefix cached there (the
// affinity rule kept them) has its auto limit keep a short queue at the
// server (limit.Sample.Reuse): of the same probe, 60 running and 40
// waiting, the band is 6-18 when the lane's requests were next turns kept
// on it and 30-90 when they were balanced by load alone.
func TestReuseTightensTheQueueBand(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    affinity
		band string
	}{
		{"next turns kept on their endpoint", affinity{prev: "http://a"}, "band 6-18"},
		{"balanced by load alone", affinity{}, "band 30-90"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := engine.Metrics{Running: 60, Queued: 40, TokenUsage: 0.5}
			d, now := autoPair(t, 100, &m)
			d.mu.Lock()
			for range 10 {
				e, _ := d.pickLocked(now, d.lanes[0], 1000, tc.a)
				if tc.a.prev != "" && e.url != tc.a.prev {
					t.Fatalf("next turn of %s went to %s", tc.a.prev, e.url)
				}
				d.acquireLocked(&call{ep: e, lane: d.lanes[0], est: 1000}, now)
			}
			d.mu.Unlock()
			var got []string
			for _, dec := range d.Observe("http://a", m, now.Add(5*time.Second)) {
				got = append(got, dec.Reason)
				if dec.Lane == "short" && strings.Contains(dec.Reason, tc.band) {
					return
				}
			}
			t.Errorf("decisions %q, want one with %s", got, tc.band)
		})
	}
}

// A next turn goes back to its endpoint although its auto limit is full,
// at most a tenth of the limit (at least one) over it; other requests, and
// next turns past the allowance, go where there is room. The controller
// counts in flight without the requests sent over the limit.
func TestNextTurnReturnsOverTheLimit(t *testing.T) {
	m := engine.Metrics{Running: 4, Queued: 0, TokenUsage: 0.1}
	d, now := autoPair(t, 4, &m)
	d.mu.Lock()
	a, l := d.epByURL["http://a"], d.lanes[0]
	place := func(aff affinity) string {
		e, _ := d.pickLocked(now, l, 1000, aff)
		if e == nil {
			return ""
		}
		d.acquireLocked(&call{ep: e, lane: l, est: 1000}, now)
		return e.url
	}
	for range 4 {
		a.lanes[0].inflight++ // a is at its limit of 4
	}
	got := []string{
		place(affinity{}),                 // a first turn: where there is room
		place(affinity{prev: "http://a"}), // back to a, over its limit
		place(affinity{prev: "http://a"}), // past the allowance of one: b
	}
	over := a.lanes[0].over
	d.mu.Unlock()
	want := []string{"http://b", "http://a", "http://b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("placements (-want +got):\n%s", diff)
	}
	if over != 1 {
		t.Errorf("a has %d requests over its limit, want 1", over)
	}
	var reasons []string
	for _, dec := range d.Observe("http://a", m, now.Add(5*time.Second)) {
		if dec.Lane == "short" {
			reasons = append(reasons, dec.Reason)
		}
	}
	if len(reasons) != 1 || !strings.Contains(reasons[0], "in flight 4/") {
		t.Errorf("decisions %q: want one counting 4 in flight (5 less the one over the limit)", reasons)
	}
}
