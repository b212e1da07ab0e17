package limit

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

const step = 5 * time.Second

// toyServer is a server whose KV pool holds slots requests at once: the
// rest queue, KV usage follows the running share of the pool, goodput the
// running count. It stands in for the probe in closed-loop tests.
type toyServer struct {
	slots float64
}

func (s toyServer) sample(inFlight int) Sample {
	running := math.Min(float64(inFlight), s.slots)
	return Sample{
		Time: time.Now(), InFlight: inFlight, Peak: inFlight, EndpointInFlight: inFlight,
		Goodput: 40 * running, Running: running, Queued: math.Max(float64(inFlight)-s.slots, 0),
		KVUsage: 0.95 * running / s.slots, TTFT: 200 * time.Millisecond,
	}
}

// run steps c against srv every 5 s of the bubble's clock, the lane always
// filling its limit, and returns the limits after each step.
func run(c *Controller, srv toyServer, steps int) []int {
	var limits []int
	for range steps {
		time.Sleep(step)
		c.Update(srv.sample(c.Limit()))
		limits = append(limits, c.Limit())
	}
	return limits
}

// inBand reports whether limit leaves a queue inside the controller's band
// for a server with slots running.
func inBand(limit int, slots float64) bool {
	p := DefaultParams
	q := float64(limit) - slots
	return q >= math.Max(p.QueueLowMin, p.QueueLow*slots)-1 && q <= math.Max(p.QueueHighMin, p.QueueHigh*slots)+1
}

// From a deliberately bad initial limit, slow start finds the server's
// size and the limit settles with a queue inside the band, then stays.
func TestConvergesFromFour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := New(Bounds{Min: 1, Initial: 4}, DefaultParams, start)
		srv := toyServer{slots: 60}
		limits := run(c, srv, 60)
		if limits[0] != 12 || limits[1] != 36 {
			t.Errorf("first limits %v, want slow start 12, 36", limits[:3])
		}
		for i, l := range limits[20:] {
			if !inBand(l, srv.slots) {
				t.Errorf("step %d: limit %d leaves a queue of %d, outside the band for 60 running", 20+i, l, l-60)
			}
		}
		if got := c.Last().Time.Sub(start); got != 60*step {
			t.Errorf("last decision at %v, want %v (one per sample)", got, 60*step)
		}
	})
}

// Slow start triples while the pool is less than half full and ends at
// SlowStartKV with the queue still empty: the KV of requests admitted by
// the last tripling is still growing, and one more would overshoot.
func TestSlowStartEndsAtHalfThePool(t *testing.T) {
	for _, tc := range []struct {
		kv        float64
		want      int
		slowStart bool
	}{
		{kv: 0.2, want: 36, slowStart: true},
		{kv: 0.49, want: 36, slowStart: true},
		{kv: 0.5, want: 13, slowStart: false}, // 12 + max(1, 5%)
		{kv: 0.8, want: 13, slowStart: false},
	} {
		c := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Unix(0, 0))
		at := func(i int, kv float64) Decision {
			return c.Update(Sample{Time: time.Unix(int64(5*i), 0), InFlight: c.Limit(), Peak: c.Limit(), EndpointInFlight: c.Limit(),
				Goodput: float64(1000 * (i + 1)), Running: float64(c.Limit()), Queued: 0, KVUsage: kv})
		}
		if d := at(1, 0.1); d.To != 12 {
			t.Fatalf("first probe at KV 0.1: %v, want slow start to 12", d)
		}
		d := at(2, tc.kv)
		if d.To != tc.want {
			t.Errorf("KV %.2f: %v, want %d", tc.kv, d, tc.want)
		}
		if got := c.slowStart; got != tc.slowStart {
			t.Errorf("KV %.2f: slow start %v after it, want %v", tc.kv, got, tc.slowStart)
		}
		if !tc.slowStart && !strings.Contains(d.Reason, fmt.Sprintf("slow start ends at KV usage %.2f", tc.kv)) {
			t.Errorf("KV %.2f: reason %q does not say slow start ended at that KV usage", tc.kv, d.Reason)
		}
	}
}

// The server shrinks (restarted with half the pool): the queue grows, the
// limit follows it down into the new band, and up again when it grows back.
func TestFollowsTheServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Now())
		run(c, toyServer{slots: 100}, 30)
		if !inBand(c.Limit(), 100) {
			t.Fatalf("limit %d not settled for 100 slots", c.Limit())
		}
		run(c, toyServer{slots: 40}, 30)
		if !inBand(c.Limit(), 40) {
			t.Errorf("after the server shrank to 40 slots the limit is %d", c.Limit())
		}
		run(c, toyServer{slots: 100}, 40)
		if !inBand(c.Limit(), 100) {
			t.Errorf("after the server grew back to 100 slots the limit is %d", c.Limit())
		}
	})
}

func sample(mod func(*Sample)) Sample {
	s := Sample{Time: time.Now(), InFlight: 100, Peak: 100, EndpointInFlight: 100, Goodput: 1000,
		Running: 60, Queued: 40, KVUsage: 0.9, TTFT: time.Second}
	if mod != nil {
		mod(&s)
	}
	return s
}

// steady returns a controller out of slow start, at limit 100.
func steady(t *testing.T) *Controller {
	t.Helper()
	c := New(Bounds{Min: 1, Initial: 100}, DefaultParams, time.Now())
	d := c.Update(sample(nil))
	if d.Action != Hold || c.Limit() != 100 {
		t.Fatalf("queue in the band: %v, want hold at 100", d)
	}
	return c
}

func TestPressureBacksOff(t *testing.T) {
	tests := []struct {
		name   string
		mod    func(*Sample)
		reason string
	}{
		{"retraction burst", func(s *Sample) { s.Retractions = 8 }, "retraction burst"},
		{"errors", func(s *Sample) { s.Errors = 2 }, "errors from the server"},
		// Without a queue gauge a rising time to first token stands for it.
		{"ttft without a queue gauge", func(s *Sample) { s.Queued = -1; s.TTFT = 10 * time.Second }, "time to first token rising"},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			c := steady(t)
			for range 5 { // history for the TTFT averages
				time.Sleep(step)
				c.Update(sample(func(s *Sample) {
					if tt.name == "ttft without a queue gauge" {
						s.Queued = -1
					}
				}))
			}
			from := c.Limit()
			time.Sleep(step)
			d := c.Update(sample(tt.mod))
			if d.Action != BackOff || d.To != int(float64(from)*0.8) || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("%s: %v, want back off %d -> %d for %q", tt.name, d, from, int(float64(from)*0.8), tt.reason)
			}
			// The next samples cool down: no raise, and no second cut before
			// the lane is back within its new limit.
			time.Sleep(step)
			if d := c.Update(sample(tt.mod)); d.Action != Hold || !strings.Contains(d.Reason, "waiting for the last cut") {
				t.Errorf("%s, still 100 in flight: %v, want hold waiting for the cut", tt.name, d)
			}
			time.Sleep(step)
			if d := c.Update(sample(func(s *Sample) { s.InFlight, s.Peak, s.Queued = c.Limit(), c.Limit(), 0 })); d.Action != Hold {
				t.Errorf("%s, cooling down: %v, want hold", tt.name, d)
			}
		})
	}
}

// A TTFT spike with a queue gauge present is not a back-off: the queue
// itself is the better evidence.
func TestTTFTIgnoredWithQueueGauge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := steady(t)
		for range 5 {
			time.Sleep(step)
			c.Update(sample(nil))
		}
		time.Sleep(step)
		if d := c.Update(sample(func(s *Sample) { s.TTFT = 30 * time.Second })); d.Action == BackOff {
			t.Errorf("TTFT spike with the queue in its band: %v, want no back-off", d)
		}
	})
}

func TestKVPinned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := steady(t)
		pinned := func(s *Sample) { s.KVUsage = 0.995 }
		for i := 1; i < DefaultParams.KVPinned; i++ {
			time.Sleep(step)
			if d := c.Update(sample(pinned)); d.Action == BackOff {
				t.Fatalf("KV pinned for %d samples: %v, want no back-off yet", i, d)
			}
		}
		time.Sleep(step)
		d := c.Update(sample(pinned))
		if d.Action != BackOff || !strings.Contains(d.Reason, "KV usage at or above 0.99 for 3 samples") || !strings.Contains(d.Reason, "kv 0.99") {
			t.Errorf("KV pinned for 3 samples: %v, want a back-off with the evidence", d)
		}
	})
}

// Too long a queue is cut by the excess, once, until the cut took effect.
func TestQueueAboveBand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := steady(t)
		time.Sleep(step)
		// 60 running: band 30-90; a queue of 120 is 60 over its middle.
		d := c.Update(sample(func(s *Sample) { s.Queued = 120 }))
		if d.Action != BackOff || d.To != 70 || !strings.Contains(d.Reason, "queue above the band (queue 120 (band 30-90)") {
			t.Errorf("queue 120: %v, want back off 100 -> 70 with the queue as evidence", d)
		}
		time.Sleep(step)
		if d := c.Update(sample(func(s *Sample) { s.Queued = 120 })); d.Action != Hold || d.To != 70 {
			t.Errorf("queue still 120 with 100 in flight: %v, want hold at 70 until the cut takes effect", d)
		}
	})
}

func TestNoRaiseUnlessUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 1, Initial: 50}, DefaultParams, time.Now())
		time.Sleep(step)
		d := c.Update(sample(func(s *Sample) { s.InFlight, s.Peak, s.Queued = 10, 12, 0 }))
		if d.Action != Hold || d.To != 50 || !strings.Contains(d.Reason, "limit not in use") {
			t.Errorf("10 of 50 in flight with room: %v, want hold", d)
		}
	})
}

func TestBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 8, Max: 20, Initial: 100}, DefaultParams, time.Now())
		if c.Limit() != 20 {
			t.Errorf("initial 100 with max 20: limit %d", c.Limit())
		}
		limits := run(c, toyServer{slots: 500}, 10)
		for _, l := range limits {
			if l > 20 {
				t.Errorf("limit %d above max 20", l)
			}
		}
		for range 20 {
			time.Sleep(step)
			c.Update(sample(func(s *Sample) { s.InFlight, s.Peak, s.Errors = c.Limit(), c.Limit(), 1 }))
		}
		if c.Limit() != 8 {
			t.Errorf("after many errors: limit %d, want the min 8", c.Limit())
		}
	})
}

// A crash under pressure caps the limit below the load that crashed, and
// from then on KV usage above 0.9 backs off at once.
func TestCrashedLowersTheCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := steady(t)
		time.Sleep(step)
		d := c.Crashed(time.Now(), 80, 0, "cuda_oom with KV usage 0.97, 0.99")
		if d.Action != Ceiling || d.From != 100 || d.To != 60 || c.Ceiling() != 60 ||
			!strings.Contains(d.Reason, "crash 1 under pressure (cuda_oom with KV usage 0.97, 0.99): ceiling 60, back off above KV usage 0.90") {
			t.Fatalf("crash with 80 in flight at limit 100: %v (ceiling %d), want ceiling 60 = 0.75 x 80", d, c.Ceiling())
		}
		limits := run(c, toyServer{slots: 500}, 20) // all the room in the world
		for _, l := range limits {
			if l > 60 {
				t.Fatalf("limit %d above the ceiling 60", l)
			}
		}
		time.Sleep(step)
		d = c.Update(sample(func(s *Sample) { s.InFlight, s.Peak, s.Queued, s.KVUsage = c.Limit(), c.Limit(), 0, 0.91 }))
		if d.Action != BackOff || !strings.Contains(d.Reason, "KV usage at or above 0.90 for 1 samples") {
			t.Errorf("KV 0.91 after the crash: %v, want an immediate back-off", d)
		}
		// A second crash lowers it again.
		time.Sleep(step)
		if d := c.Crashed(time.Now(), 40, 0, "cuda_oom"); c.Ceiling() != int(0.75*float64(min(40, d.From))) {
			t.Errorf("second crash: %v, ceiling %d", d, c.Ceiling())
		}
	})
}

// A lane with one request in flight when the server crashed (a long lane
// of a few escalations beside a full short lane) keeps room for its
// starting limit: a ceiling of 1 would run its work one at a time.
func TestCrashedKeepsTheStartingLimit(t *testing.T) {
	for _, tc := range []struct {
		b        Bounds
		inFlight int
		want     int
	}{
		{Bounds{Min: 1, Initial: 4}, 1, 4},
		{Bounds{Min: 1, Initial: 100}, 1, 4}, // at most 4
		{Bounds{Min: 1, Initial: 2}, 1, 2},
		{Bounds{Min: 6, Initial: 4}, 1, 6}, // the lane's min, if higher
		{Bounds{Min: 1, Initial: 4}, 40, 30},
	} {
		c := New(tc.b, DefaultParams, time.Unix(0, 0))
		c.limit = 50
		if c.Crashed(time.Unix(5, 0), tc.inFlight, 0, "cuda_oom"); c.Ceiling() != tc.want {
			t.Errorf("%+v, %d in flight at the crash: ceiling %d, want %d", tc.b, tc.inFlight, c.Ceiling(), tc.want)
		}
	}
}

func TestRescale(t *testing.T) {
	c := New(Bounds{Min: 1, Initial: 120}, DefaultParams, time.Unix(0, 0))
	d := c.Rescale(time.Unix(5, 0), 231120, 115560)
	if d.Action != BackOff || d.To != 60 || !strings.Contains(d.Reason, "KV pool changed from 231120 to 115560 tokens") {
		t.Errorf("pool halved: %v, want the limit halved to 60", d)
	}
}

// Raises that buy no goodput stop the raising for a while, even with room.
func TestPlateauHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Now())
		flat := func(s *Sample) {
			s.InFlight, s.Peak, s.EndpointInFlight, s.Queued, s.Running, s.Goodput, s.KVUsage = c.Limit(), c.Limit(), c.Limit(), 0, float64(c.Limit()), 500, 0.3
		}
		// 4 -> 12 -> 36 with goodput flat (KV usage below SlowStartKV): the second flat raise starts the hold.
		var d Decision
		for range 3 {
			time.Sleep(step)
			d = c.Update(sample(flat))
		}
		if d.Action != Hold || d.To != 36 || !strings.Contains(d.Reason, "goodput stopped rising") {
			t.Fatalf("two slow-start raises without more goodput: %v, want a plateau hold at 36", d)
		}
		for range DefaultParams.PlateauHold - 1 {
			time.Sleep(step)
			if d := c.Update(sample(flat)); d.To != 36 {
				t.Fatalf("during the plateau hold: %v, want 36", d)
			}
		}
		time.Sleep(step)
		if d := c.Update(sample(flat)); d.Action != Raise {
			t.Errorf("after the hold: %v, want a new probe upwards", d)
		}
	})
}

// The ceiling after a crash is a share of what the whole endpoint had in
// flight: a lane the controller had cut to a few requests (a long lane
// beside a full short one) keeps room to use, and the dispatcher holds the
// lanes' sum to the ceiling.
func TestCrashedCeilingFromTheEndpointLoad(t *testing.T) {
	c := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Unix(0, 0))
	c.limit = 6
	d := c.Crashed(time.Unix(5, 0), 87, 0, "cuda_oom")
	if c.Ceiling() != 65 || d.To != 6 {
		t.Errorf("lane at 6 of an endpoint with 87 in flight: %v, ceiling %d; want ceiling 65 (0.75 x 87), limit kept at 6", d, c.Ceiling())
	}
}

// After a crash the limit rises only while KV usage is below 0.8, and out
// of a deep trough (below 0.6, the queue empty) by a quarter at a time.
func TestAfterACrashRaisesOnlyWithRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 1, Initial: 20}, DefaultParams, time.Now())
		c.Crashed(time.Now(), 200, 0, "cuda_oom")
		probe := func(kv float64) Decision {
			time.Sleep(step)
			return c.Update(sample(func(s *Sample) {
				s.InFlight, s.Peak, s.Queued, s.Running, s.KVUsage = c.Limit(), c.Limit(), 0, float64(c.Limit()), kv
			}))
		}
		for range DefaultParams.Cooldown {
			probe(0.5)
		}
		if d := probe(0.82); d.Action != Hold || !strings.Contains(d.Reason, "KV usage at or above 0.80 on a server that crashed under pressure") {
			t.Errorf("KV 0.82 after a crash: %v, want a hold", d)
		}
		if d := probe(0.7); d.Action != Raise || d.To != 21 {
			t.Errorf("KV 0.70 after a crash: %v, want a raise of one (5%% of 20)", d)
		}
		if d := probe(0.4); d.Action != Raise || d.To != 26 || !strings.Contains(d.Reason, "empty queue, KV room") {
			t.Errorf("KV 0.40 after a crash: %v, want a raise by a quarter, to 26", d)
		}
	})
}

// Shed drops the limit to what the lane has left, never below its min,
// and the cooldown follows.
func TestShed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 2, Initial: 40}, DefaultParams, time.Now())
		d := c.Shed(time.Now(), 25, "KV usage 0.97, 0.98 at the last two probes: 15 requests cancelled")
		if d.Action != Shed || d.From != 40 || d.To != 25 || c.Moved() != d {
			t.Errorf("shed with 25 left: %v, want 40 -> 25, recorded as the last move", d)
		}
		if d := c.Shed(time.Now(), 0, "again"); d.To != 2 {
			t.Errorf("shed with none left: %v, want the min 2", d)
		}
		time.Sleep(step)
		if d := c.Update(sample(func(s *Sample) { s.InFlight, s.Peak, s.Queued, s.Running, s.KVUsage = 2, 2, 0, 2, 0.3 })); d.Action != Hold || !strings.Contains(d.Reason, "cooling down") {
			t.Errorf("first probe after a shed: %v, want the cooldown", d)
		}
	})
}

// A server that crashed at a KV usage below 0.9 teaches the controller its
// level: back off 0.05 below it, raise only 0.1 below that.
func TestCrashedLearnsTheLevel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 1, Initial: 20}, DefaultParams, time.Now())
		d := c.Crashed(time.Now(), 40, 0.85, "cuda_oom")
		if c.CrashKV() < 0.799 || c.CrashKV() > 0.801 || !strings.Contains(d.Reason, "back off above KV usage 0.80") {
			t.Fatalf("crash at KV 0.85: %v (back-off level %.2f), want 0.80", d, c.CrashKV())
		}
		for range DefaultParams.Cooldown {
			time.Sleep(step)
			c.Update(sample(func(s *Sample) {
				s.InFlight, s.Peak, s.Queued, s.Running, s.KVUsage = c.Limit(), c.Limit(), 0, float64(c.Limit()), 0.5
			}))
		}
		time.Sleep(step)
		if d := c.Update(sample(func(s *Sample) {
			s.InFlight, s.Peak, s.Queued, s.Running, s.KVUsage = c.Limit(), c.Limit(), 0, float64(c.Limit()), 0.72
		})); d.Action != Hold || !strings.Contains(d.Reason, "at or above 0.70") {
			t.Errorf("KV 0.72: %v, want a hold (raises stop at 0.70)", d)
		}
		time.Sleep(step)
		if d := c.Update(sample(func(s *Sample) {
			s.InFlight, s.Peak, s.Queued, s.Running, s.KVUsage = c.Limit(), c.Limit(), 0, float64(c.Limit()), 0.81
		})); d.Action != BackOff {
			t.Errorf("KV 0.81: %v, want a back-off", d)
		}
		low := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Now())
		low.Crashed(time.Now(), 10, 0.3, "cuda_oom")
		if low.CrashKV() != 0.5 {
			t.Errorf("crash at KV 0.3: back-off level %.2f, want the floor 0.5", low.CrashKV())
		}
	})
}

// A server asking for less (429) backs the limit off from what was in
// flight, never above the limit, and never below the bounds.
func TestBackpressure(t *testing.T) {
	tests := []struct {
		name     string
		inFlight int
		want     int
	}{
		{"limit filled", 100, 80},
		{"fewer in flight than the limit", 50, 40},
		{"more in flight than the limit (it was just cut)", 200, 80},
		{"one in flight", 1, 1},
	}
	for _, tt := range tests {
		c := steady(t)
		d := c.Backpressure(time.Now(), tt.inFlight, "backpressure: HTTP 429")
		if d.Action != BackOff || d.From != 100 || d.To != tt.want || c.Limit() != tt.want || d.Reason != "backpressure: HTTP 429" {
			t.Errorf("%s: %v, want back off 100 -> %d with the reason", tt.name, d, tt.want)
		}
	}
}

// A slot-bound server (llama-server's --parallel 8): the limit settles at
// the slot count with nothing waiting, where a KV-pool server's band would
// keep 4 to 12 requests queued behind the same 8 running.
func TestSlotBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := toyServer{slots: 8}
		slotted := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Now())
		pool := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Now())
		var slottedLimits, poolLimits []int
		for range 30 {
			time.Sleep(step)
			s := srv.sample(slotted.Limit())
			s.Slots = 8
			slotted.Update(s)
			slottedLimits = append(slottedLimits, slotted.Limit())
			pool.Update(srv.sample(pool.Limit()))
			poolLimits = append(poolLimits, pool.Limit())
		}
		for i, l := range slottedLimits {
			if l > 8 {
				t.Fatalf("slot-bound limit %d at step %d (limits %v), want at most the 8 slots", l, i, slottedLimits)
			}
		}
		if got := slottedLimits[len(slottedLimits)-1]; got != 8 {
			t.Errorf("slot-bound limit settled at %d (limits %v), want 8", got, slottedLimits)
		}
		if got := poolLimits[len(poolLimits)-1]; got < 12 {
			t.Errorf("KV-pool limit settled at %d, want the band's queue (>= 12) on top of 8 running: the contrast this test rests on", got)
		}
		if d := slotted.Last(); !strings.Contains(d.Reason, "queue 0 (band 0-1)") {
			t.Errorf("last decision %q, want the slot band 0-1 in its evidence", d)
		}
	})
}

// The slot cap follows the server: a limit above the slots (a lane
// started high) comes down to them at the first sample that names them.
func TestSlotBoundCapsAHighStart(t *testing.T) {
	c := New(Bounds{Min: 1, Initial: 32}, DefaultParams, time.Now())
	s := toyServer{slots: 8}.sample(32)
	s.Slots = 8
	if d := c.Update(s); d.To != 8 {
		t.Errorf("decision %v, want the limit cut to the 8 slots", d)
	}
}

// While the lane's requests reuse a cached prefix (Sample.Reuse), the
// queue is held to the cache band, 0.1 to 0.3 times the running requests:
// the same queue the default band holds is cut, and the controller settles
// with a short queue.
func TestReuseKeepsTheQueueShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := steady(t) // 60 running, 40 queued: in the default band 30-90
		time.Sleep(step)
		d := c.Update(sample(func(s *Sample) { s.Reuse = true }))
		if d.Action != BackOff || d.To >= 100 || !strings.Contains(d.Reason, "queue above the band (queue 40 (band 6-18)") {
			t.Errorf("queue 40 reusing a cached prefix: %v, want a back off with band 6-18 as evidence", d)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		srv := toyServer{slots: 60}
		c := New(Bounds{Min: 1, Initial: 4}, DefaultParams, time.Now())
		for range 60 {
			time.Sleep(step)
			s := srv.sample(c.Limit())
			s.Reuse = true
			c.Update(s)
		}
		if q := float64(c.Limit()) - srv.slots; q < 6-1 || q > 18+1 {
			t.Errorf("settled at limit %d on 60 slots: queue %.0f, want 6-18", c.Limit(), q)
		}
	})
}

// In a job's tail the server's batch shrinks whatever the limit: requests
// finish faster than the lane's raises add them, and goodput falls with the
// batch. Raises made then say nothing of whether more requests help, so they
// start no plateau hold: on bench/sweep's kv231k the hold kept the long lane
// at 10 for 12 probes while the server's queue was empty and KV usage fell
// from 0.84 to 0.5, and the escalations of truncated answers waited at the
// client (1,443 against 1,497 tokens/s in the run without it).
func TestPlateauNotJudgedWhileTheBatchShrinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Bounds{Min: 1, Initial: 8}, DefaultParams, time.Now())
		running, good := 60.0, 2000.0
		for i := range 6 {
			time.Sleep(step)
			d := c.Update(sample(func(s *Sample) {
				s.InFlight, s.Peak, s.EndpointInFlight = c.Limit(), c.Limit(), 60
				s.Queued, s.Running, s.Goodput, s.KVUsage = 0, running, good, 0.6
			}))
			if d.Action != Raise {
				t.Fatalf("step %d, the server's batch shrinking under an empty queue: %v, want a raise", i, d)
			}
			running, good = running-6, good*0.85
		}
	})
}

// A lane whose requests run while the server's queue, in the band, holds
// the endpoint's other lanes' requests is raised a step: held there, a long
// lane cut low keeps its escalations at the client for the rest of the job.
func TestCrowdedOutLaneRaises(t *testing.T) {
	tests := []struct {
		name                   string
		waiting, othersWaiting int
		want                   Action
		to                     int
	}{
		{"the queue is the other lane's", 0, 40, Raise, 9},
		{"its own share waits already", 3, 37, Hold, 8},
		{"no other lane waits", 0, 0, Hold, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(Bounds{Min: 1, Initial: 8}, DefaultParams, time.Now())
			lane := func(s *Sample) { s.InFlight, s.Peak, s.EndpointInFlight = 8, 8, 100 }
			if d := c.Update(sample(lane)); d.Action != Hold {
				t.Fatalf("queue in the band, the lane's own: %v, want hold", d)
			}
			d := c.Update(sample(func(s *Sample) {
				lane(s)
				s.Waiting, s.OthersWaiting = tt.waiting, tt.othersWaiting
			}))
			if d.Action != tt.want || d.To != tt.to {
				t.Errorf("queue 40 (band 30-90), the lane 8 of 100 in flight with %d waiting, other lanes %d: %v, want %s at %d",
					tt.waiting, tt.othersWaiting, d, tt.want, tt.to)
			}
		})
	}
}
