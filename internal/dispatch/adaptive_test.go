package dispatch

import (
	"context"
	"errors"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

const allMetrics = engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage | engine.FieldRetractionsTotal | engine.FieldMaxTotalTokens

// slotServer is a fake server that decodes slots requests at once and
// queues the rest, each request taking work once running; metrics
// describes it the way a probe would.
type slotServer struct {
	slots int
	work  time.Duration
	sem   chan struct{}

	mu             sync.Mutex
	inFlight, peak int
	served         int
}

func newSlotServer(slots int, work time.Duration) *slotServer {
	return &slotServer{slots: slots, work: work, sem: make(chan struct{}, slots)}
}

func (s *slotServer) script() script {
	return func(ctx context.Context, c call1) (llm.Result, error) {
		s.mu.Lock()
		s.inFlight++
		s.peak = max(s.peak, s.inFlight)
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.inFlight--
			s.mu.Unlock()
		}()
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "cancelled", Err: ctx.Err()}
		}
		defer func() { <-s.sem }()
		res, err := generate(ctx, c, s.work, "stop")
		s.mu.Lock()
		s.served++
		s.mu.Unlock()
		return res, err
	}
}

func (s *slotServer) metrics() engine.Metrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	running := math.Min(float64(s.inFlight), float64(s.slots))
	return engine.Metrics{Running: running, Queued: float64(s.inFlight) - running, TokenUsage: 0.9 * running / float64(s.slots),
		MaxTotalTokens: float64(s.slots) * 1000, Present: allMetrics}
}

// Two servers of 40 and 10 slots behind one auto lane that starts at 4:
// each endpoint's own limit settles with a queue in its band, and the work
// divides by size. Everything runs on the bubble's clock.
func TestAutoLimitPerEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 3000)
		big, small := newSlotServer(40, 10*time.Second), newSlotServer(10, 10*time.Second)
		tr := newTracker()
		eps, fakes := fleet(tr, nil, "http://big", "http://small")
		fakes["http://big"].setScript(big.script())
		fakes["http://small"].setScript(small.script())
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 100}}
		d := mustNew(t, cfg)

		ctx, stop := context.WithCancel(t.Context())
		probes := make(chan struct{})
		var limits sync.Map // url -> last limit seen
		go func() {
			defer close(probes)
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(5 * time.Second):
				}
				for url, s := range map[string]*slotServer{"http://big": big, "http://small": small} {
					for _, dec := range d.Observe(url, s.metrics(), time.Now()) {
						limits.Store(url, dec.To)
					}
				}
			}
		}()
		if err := d.Run(ctx); err != nil {
			t.Fatalf("Run: %v", err)
		}
		stop()
		<-probes

		if got := st.states()[store.Done]; got != 3000 {
			t.Fatalf("done %d of 3000", got)
		}
		for url, s := range map[string]*slotServer{"http://big": big, "http://small": small} {
			v, _ := limits.Load(url)
			l := v.(int)
			t.Logf("%s final limit %d", url, l)
			// 0.5 to 1.5 times the slots queued, give or take the last step.
			if l < s.slots*3/2-2 || l > s.slots*5/2+2 {
				t.Errorf("%s (%d slots): final limit %d, want a queue of 0.5-1.5 x slots", url, s.slots, l)
			}
		}
		share := float64(big.served) / float64(big.served+small.served)
		t.Logf("served big %d small %d; peaks %d %d", big.served, small.served, big.peak, small.peak)
		if share < 0.72 || share > 0.88 {
			t.Errorf("big server served %d, small %d: share %.2f, want about 0.8 (40 of 50 slots)", big.served, small.served, share)
		}
		snap := d.Snapshot()
		for _, e := range snap.Endpoints {
			if e.KVTokens == 0 || e.KVTokensSource != CapacityServer || len(e.Lanes) != 1 || !e.Lanes[0].Auto || e.Lanes[0].Decision == nil {
				t.Errorf("snapshot of %s: kv %v from %q, lanes %+v: want the pool, the limit and its last decision", e.URL, e.KVTokens, e.KVTokensSource, e.Lanes)
			}
		}
		if !snap.Lanes[0].Auto {
			t.Errorf("lane stats %+v: want auto", snap.Lanes[0])
		}
	})
}

// Token-aware balancing: with both pools known, requests of the same size
// divide as the pools do, whatever the request counts; with a pool unknown,
// by requests in flight as before.
func TestPickByTokens(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "http://big", "http://small")
	d := mustNew(t, baseConfig(newFakeStore(), eps))
	now := time.Unix(1000, 0)
	d.SetCapacity("http://big", 200000, CapacityJob)
	d.SetCapacity("http://small", 50000, CapacityJob)
	picks := map[string]int{}
	for range 100 {
		d.mu.Lock()
		e, _ := d.pickLocked(now, d.lanes[0], 2000, affinity{})
		cl := &call{ep: e, lane: d.lanes[0], est: 2000}
		d.acquireLocked(cl, now)
		d.mu.Unlock()
		picks[e.url]++
	}
	if picks["http://big"] != 80 || picks["http://small"] != 20 {
		t.Errorf("picks %v, want 80 big and 20 small (pools 200k and 50k)", picks)
	}
	snap := d.Snapshot()
	if snap.Endpoints[0].CommittedTokens != 160000 || snap.Endpoints[0].KVTokensSource != CapacityJob {
		t.Errorf("big endpoint committed %v from %q, want 160000 tokens from the job", snap.Endpoints[0].CommittedTokens, snap.Endpoints[0].KVTokensSource)
	}

	// A server's own figure replaces the job's; an unknown pool falls back to counts.
	d.Observe("http://big", engine.Metrics{MaxTotalTokens: 100000, Present: engine.FieldMaxTotalTokens}, now)
	if s := d.Snapshot().Endpoints[0]; s.KVTokens != 100000 || s.KVTokensSource != CapacityServer {
		t.Errorf("after a probe: pool %v from %q, want 100000 from the server", s.KVTokens, s.KVTokensSource)
	}
	d.SetCapacity("http://big", 300000, CapacityJob)
	if s := d.Snapshot().Endpoints[0]; s.KVTokens != 100000 {
		t.Errorf("the job's figure replaced the server's: %v", s.KVTokens)
	}
	eps2, _ := fleet(newTracker(), ok(time.Second), "http://a", "http://b")
	d2 := mustNew(t, baseConfig(newFakeStore(), eps2))
	d2.SetCapacity("http://a", 200000, CapacityJob)
	d2.mu.Lock()
	d2.epByURL["http://b"].inflight = 3
	d2.epByURL["http://a"].inflight = 5
	e, _ := d2.pickLocked(now, d2.lanes[0], 1000, affinity{})
	d2.mu.Unlock()
	if e.url != "http://b" {
		t.Errorf("with b's pool unknown: picked %s, want b (fewer in flight)", e.url)
	}
}

// oneEndpoint is a dispatcher with the given lanes on one endpoint,
// http://a, whose requests the tests place by hand.
func oneEndpoint(t *testing.T, lanes ...LaneConfig) *Dispatcher {
	t.Helper()
	eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
	cfg := baseConfig(newFakeStore(), eps)
	cfg.Lanes = lanes
	return mustNew(t, cfg)
}

// holdCalls places n requests on e by hand, as if sent and not answered
// yet: the i-th in lane laneOf(i), estimated at 2,000 tokens; each call's
// fields may be set by prep before it is counted.
func holdCalls(d *Dispatcher, e *endpoint, now time.Time, n int, laneOf func(i int) *lane, prep func(*call)) []*call {
	d.mu.Lock()
	defer d.mu.Unlock()
	calls := make([]*call, n)
	for i := range calls {
		cl := &call{ep: e, lane: laneOf(i), start: now, est: 2000, cancel: func(error) {}}
		if prep != nil {
			prep(cl)
		}
		d.acquireLocked(cl, now)
		calls[i] = cl
	}
	return calls
}

// releaseCalls ends calls without an answer, as a pause does.
func releaseCalls(d *Dispatcher, calls []*call) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cl := range calls {
		d.releaseLocked(cl, 0, 0, false)
	}
}

// observeKV feeds n probes with KV usage kv, 5 s apart.
func observeKV(d *Dispatcher, url string, kv float64, n int, at *time.Time) {
	for range n {
		*at = at.Add(5 * time.Second)
		d.Observe(url, engine.Metrics{TokenUsage: kv, Running: 50, Queued: 10, Present: engine.FieldTokenUsage | engine.FieldRunning | engine.FieldQueued}, *at)
	}
}

// underPressure holds 40 streaming calls of 1,000-token prompts on e (36
// in d's first lane, 4 in its second) and has three probes read KV usage
// 0.94: a crash now is one under pressure. It returns the calls to release.
func underPressure(d *Dispatcher, e *endpoint, now *time.Time) []*call {
	calls := holdCalls(d, e, *now, 40, func(i int) *lane {
		if i >= 36 {
			return d.lanes[1]
		}
		return d.lanes[0]
	}, func(cl *call) { cl.prompt = 1000; cl.streaming.Store(true) })
	observeKV(d, e.url, 0.94, 3, now)
	return calls
}

func TestNoteCrash(t *testing.T) {
	d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 64}, MaxTokens: 100}, LaneConfig{Name: "long", Concurrency: 16, MaxTokens: 1000})
	at := time.Unix(1000, 0)

	observeKV(d, "http://a", 0.5, 3, &at)
	if got := d.NoteCrash("http://a", engine.CauseCUDAOOM, at); got != nil {
		t.Errorf("OOM with KV at 0.5: %v, want no ceiling (not a crash under pressure)", got)
	}
	observeKV(d, "http://a", 0.97, 3, &at)
	if got := d.NoteCrash("http://a", engine.CauseNCCL, at); got != nil {
		t.Errorf("NCCL crash with KV high: %v, want no ceiling (not out of memory)", got)
	}
	observeKV(d, "http://a", 0.97, 3, &at) // the restarted server fills up again
	got := d.NoteCrash("http://a", engine.CauseCUDAOOM, at)
	if len(got) != 2 {
		t.Fatalf("OOM with KV high: %v, want a decision per lane", got)
	}
	if a := got[0]; a.Lane != "short" || a.Action != limit.Ceiling || a.To != 48 ||
		!strings.Contains(a.Reason, "cuda_oom with KV usage 0.97, 0.97, 0.97 over the last probes") {
		t.Errorf("auto lane: %+v, want a ceiling of 48 (0.75 x 64) with the evidence", a)
	}
	if f := got[1]; f.Lane != "long" || f.Action != limit.Hold || f.To != 16 || !strings.Contains(f.Reason, "concurrency: auto would lower it") {
		t.Errorf("fixed lane: %+v, want its limit kept and the advice", f)
	}
	s := d.Snapshot().Endpoints[0].Lanes[0]
	if s.Ceiling != 48 || s.Limit != 48 || s.Decision == nil || s.Decision.Action != limit.Ceiling {
		t.Errorf("snapshot after the crash: %+v, want limit and ceiling 48 and the ceiling decision", s)
	}
}

// A paused endpoint's probes make no decisions, and its first interval after
// resuming starts afresh; a restarted server's counters start again.
func TestObservePausedAndRestarted(t *testing.T) {
	d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 8}, MaxTokens: 100})
	at := time.Unix(1000, 0)
	m := engine.Metrics{Running: 2, Queued: 0, RetractionsTotal: 40, Present: engine.FieldRunning | engine.FieldQueued | engine.FieldRetractionsTotal}
	d.Observe("http://a", m, at)
	d.Pause("http://a", "down")
	at = at.Add(5 * time.Second)
	if got := d.Observe("http://a", m, at); len(got) != 0 {
		t.Errorf("paused: %v, want no decisions", got)
	}
	d.Resume("http://a")
	at = at.Add(5 * time.Second)
	if got := d.Observe("http://a", m, at); len(got) != 0 {
		t.Errorf("first probe after resuming: %v, want none (a fresh interval)", got)
	}
	// Down with no probe answered while paused, after an error the server
	// answered just before: the restarted server's first probe starts a
	// fresh interval, and the old error is not held against it.
	d.mu.Lock()
	e := d.epByURL["http://a"]
	cl := &call{ep: e, lane: d.lanes[0], start: at, cancel: func(error) {}}
	d.acquireLocked(cl, at)
	d.releaseLocked(cl, 0, 0, true)
	d.mu.Unlock()
	d.Pause("http://a", "down")
	d.Resume("http://a")
	at = at.Add(10 * time.Minute)
	if got := d.Observe("http://a", m, at); len(got) != 0 {
		t.Errorf("first probe after a pause no probe answered: %v, want none (a fresh interval)", got)
	}
	// The restarted server's counter is at 7: seven retractions, not -33.
	m.RetractionsTotal = 7
	at = at.Add(5 * time.Second)
	got := d.Observe("http://a", m, at)
	if len(got) != 1 || got[0].Action != limit.BackOff || !strings.Contains(got[0].Reason, "retracted 7") {
		t.Errorf("7 retractions after a restart with 2 running: %v, want a back-off on the burst", got)
	}
}

// At the end of a lane, requests waiting in one server's queue move to a
// server with room and an empty queue: the most recently sent ones without
// a first token, at most as many as the waiting server queues and as the
// idle one's free pool holds, once per probe.
func TestMoveQueuedAtTheEnd(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "http://busy", "http://idle")
	cfg := baseConfig(newFakeStore(), eps)
	cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 100, MaxTokens: 1000}}
	d := mustNew(t, cfg)
	now := time.Unix(1000, 0)
	l := d.lanes[0]
	l.outSum, l.outN = 1000, 1 // requests of 1,000 tokens out plus about 1,000 in
	d.Observe("http://busy", engine.Metrics{MaxTotalTokens: 100000, Queued: 3, TokenUsage: 0.95, Present: allMetrics}, now)
	d.Observe("http://idle", engine.Metrics{MaxTotalTokens: 100000, Queued: 0, TokenUsage: 0.9, Present: allMetrics}, now)

	busy := d.epByURL["http://busy"]
	causes := map[int]error{}
	var mu sync.Mutex
	for i := range 6 {
		cl := &call{ep: busy, lane: l, start: now.Add(time.Duration(i) * time.Second), est: 2000,
			cancel: func(cause error) { mu.Lock(); causes[i] = cause; mu.Unlock() }}
		if i < 2 {
			cl.streaming.Store(true) // generating: never moved
		}
		d.acquireLocked(cl, now)
	}
	d.mu.Lock()
	d.moveQueuedLocked(l, now)
	d.mu.Unlock()
	// The idle server's free 10% of 100,000 tokens holds 5 such requests; the
	// busy one queues 3: the three most recent without a token move.
	for i := range 6 {
		want := i >= 3
		if got := errors.Is(causes[i], errMoved); got != want {
			t.Errorf("request %d: moved %v, want %v", i, got, want)
		}
	}
	if d.Snapshot().Counters.Moved != 3 {
		t.Errorf("moved counter %d, want 3", d.Snapshot().Counters.Moved)
	}
	// Not again before the idle server's next probe.
	clear(causes)
	d.mu.Lock()
	d.moveQueuedLocked(l, now)
	d.mu.Unlock()
	if len(causes) != 0 {
		t.Errorf("moved again without a new probe: %v", causes)
	}
}

// KV usage pinned at 0.97 or above for two probes sheds load: every
// request of an auto lane still waiting at the server, then running ones,
// the least generated first, until their footprint brings usage to 0.9.
// They are released without spending an attempt; a fixed lane's requests
// are left alone; the auto lane's limit drops to what it has left.
func TestShedUnderPinnedKV(t *testing.T) {
	d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 40}, MaxTokens: 1000}, LaneConfig{Name: "long", Concurrency: 8, MaxTokens: 10000})
	now := time.Unix(1000, 0)
	e := d.epByURL["http://a"]
	short, long := d.lanes[0], d.lanes[1]

	causes := map[string]error{}
	var mu sync.Mutex
	add := func(name string, l *lane, streaming bool, generated int64) {
		cl := &call{ep: e, lane: l, start: now, est: 2000, prompt: 1000,
			cancel: func(cause error) { mu.Lock(); causes[name] = cause; mu.Unlock() }}
		cl.streaming.Store(streaming)
		cl.generated.Store(generated)
		d.acquireLocked(cl, now)
	}
	add("waiting1", short, false, 0)
	add("waiting2", short, false, 0)
	add("run100", short, true, 100)
	add("run500", short, true, 500)
	add("run6000", short, true, 6000)
	add("run9000", short, true, 9000)
	add("fixed", long, false, 0)

	m := engine.Metrics{MaxTotalTokens: 100000, TokenUsage: 0.98, Running: 4, Queued: 3, Present: allMetrics}
	d.Observe("http://a", m, now)
	now = now.Add(5 * time.Second)
	d.Observe("http://a", engine.Metrics{MaxTotalTokens: 100000, TokenUsage: 0.5, Present: allMetrics}, now)
	now = now.Add(5 * time.Second)
	d.Observe("http://a", m, now)
	if len(causes) != 0 {
		t.Fatalf("KV 0.98 once after 0.5: shed %v, want nothing yet", causes)
	}
	now = now.Add(5 * time.Second)
	var shed *LimitDecision
	for _, dec := range d.Observe("http://a", m, now) {
		if dec.Action == limit.Shed {
			shed = &dec
		}
	}
	// 8,000 tokens to free (0.98 - 0.9 of 100,000): 1,100 + 1,500 + 7,000.
	for name, want := range map[string]bool{"waiting1": true, "waiting2": true, "run100": true, "run500": true, "run6000": true, "run9000": false, "fixed": false} {
		if got := errors.Is(causes[name], errShed); got != want {
			t.Errorf("%s: shed %v, want %v", name, got, want)
		}
	}
	if shed == nil || shed.Lane != "short" || shed.To != 1 ||
		!strings.Contains(shed.Reason, "KV usage 0.98, 0.98 at the last two probes: 3 running requests cancelled (about 9600 tokens of KV, 6600 of them generated) and 2 waiting") {
		t.Errorf("decision %+v, want the short lane cut to the 1 it has left, with the evidence", shed)
	}
	if got := d.Snapshot().Counters.Shed; got != 5 {
		t.Errorf("shed counter %d, want 5", got)
	}
	// Not at the next probe, whose reading may predate the cancellations,
	// and never the same request twice.
	clear(causes)
	now = now.Add(5 * time.Second)
	d.Observe("http://a", m, now)
	if len(causes) != 0 {
		t.Errorf("KV 0.98 at the probe right after the shed: %v, want nothing shed", causes)
	}
	now = now.Add(5 * time.Second)
	d.Observe("http://a", m, now)
	if len(causes) != 1 || !errors.Is(causes["run9000"], errShed) {
		t.Errorf("KV 0.98 at the next two probes: shed %v, want only run9000, the one left", causes)
	}
	// A shed request goes back to pending without an attempt.
	if v := d.decide(short, store.Claimed{}, nil, llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "cancelled"}, errShed); v.out != outRelease {
		t.Errorf("a shed request's verdict %v, want a release", v.out)
	}
}

// After a crash under pressure the auto lanes share one ceiling, and KV
// usage of 0.95 sheds at the first probe.
func TestCrashCeilingIsTheEndpoints(t *testing.T) {
	d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 1000}, LaneConfig{Name: "long", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 10000})
	now := time.Unix(1000, 0)
	e := d.epByURL["http://a"]
	short, long := d.lanes[0], d.lanes[1]
	calls := underPressure(d, e, &now)
	got := d.NoteCrash("http://a", engine.CauseCUDAOOM, now)
	if len(got) != 2 || got[0].Decision.Action != limit.Ceiling || e.ceiling != 30 {
		t.Fatalf("crash with 40 in flight (36 short, 4 long): %v, endpoint ceiling %d; want 30 (0.75 x 40) for both lanes", got, e.ceiling)
	}
	// The server restarted empty: the lanes may fill 30 between them.
	releaseCalls(d, calls)
	d.mu.Lock()
	for range 28 {
		cl := &call{ep: e, lane: short, start: now, est: 2000, cancel: func(error) {}}
		d.acquireLocked(cl, now)
	}
	roomLong := e.roomLocked(long, now)
	d.mu.Unlock()
	if roomLong != 2 {
		t.Errorf("long lane (limit %d) with 28 short requests in flight: room %d, want the 2 the ceiling of 30 leaves", e.lanes[1].ctl.Limit(), roomLong)
	}
	shedAt := now.Add(5 * time.Second)
	var shed bool
	for _, dec := range d.Observe("http://a", engine.Metrics{MaxTotalTokens: 100000, TokenUsage: 0.95, Present: allMetrics}, shedAt) {
		shed = shed || dec.Action == limit.Shed
	}
	if !shed {
		t.Errorf("KV 0.95 once after the crash: no shed")
	}
	// Out of memory again at KV usage 0.85: below the 0.9 that makes a
	// first crash one under pressure, but this server has crashed under
	// pressure before. Its level is learnt: back off at 0.80.
	now = shedAt
	observeKV(d, "http://a", 0.2, 3, &now)
	if got := d.NoteCrash("http://a", engine.CauseCUDAOOM, now); got != nil {
		t.Errorf("out of memory at KV usage 0.2 (right after a restart): %v, want no ceiling", got)
	}
	observeKV(d, "http://a", 0.85, 3, &now)
	again := d.NoteCrash("http://a", engine.CauseCUDAOOM, now)
	if len(again) != 2 || !strings.Contains(again[0].Reason, "on a server that crashed under pressure before") || math.Abs(e.crashKV-0.8) > 1e-9 {
		t.Errorf("second crash at KV 0.85: %v, back-off level %.2f; want a ceiling decision and 0.80", again, e.crashKV)
	}
}

// A crash's KV readings belong to the server that crashed: an out-of-memory
// crash of the restarted server, one probe after it came back nearly
// empty, is not one under pressure, and lowers no ceiling again.
func TestOOMAfterARestartIsJudgedOnTheNewServer(t *testing.T) {
	d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4, Max: 100}, MaxTokens: 1000})
	now := time.Unix(1000, 0)
	e := d.epByURL["http://a"]
	calls := holdCalls(d, e, now, 40, func(int) *lane { return d.lanes[0] }, nil)
	observeKV(d, "http://a", 0.95, 3, &now)
	if got := d.NoteCrash("http://a", engine.CauseCUDAOOM, now); got == nil || e.ceiling != 30 {
		t.Fatalf("crash at KV 0.95 with 40 in flight: %v, endpoint ceiling %d; want 30", got, e.ceiling)
	}
	d.Pause("http://a", "down")
	releaseCalls(d, calls)
	d.Resume("http://a")
	observeKV(d, "http://a", 0.05, 1, &now)
	if got := d.NoteCrash("http://a", engine.CauseCUDAOOM, now); got != nil || e.ceiling != 30 {
		t.Errorf("out of memory one probe after the restart, at KV 0.05: %v, endpoint ceiling %d; want no decision and 30", got, e.ceiling)
	}
}

// A server restarted with another KV pool rescales its auto lanes'
// ceilings, and the ceiling their sum is held to follows: two lanes on a
// pool halved after a crash may not fill more than the new ceiling
// between them, and on a pool doubled they may fill the doubled one.
func TestRescaleMovesTheSharedCeiling(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool float64
		want int
	}{{"halved", 50000, 15}, {"doubled", 200000, 60}} {
		t.Run(tc.name, func(t *testing.T) {
			d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 1000},
				LaneConfig{Name: "long", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 10000})
			now := time.Unix(1000, 0)
			e := d.epByURL["http://a"]
			calls := holdCalls(d, e, now, 40, func(i int) *lane { return d.lanes[i%2] }, nil)
			for range 3 {
				now = now.Add(5 * time.Second)
				d.Observe("http://a", engine.Metrics{MaxTotalTokens: 100000, TokenUsage: 0.95, Running: 40, Present: allMetrics}, now)
			}
			if d.NoteCrash("http://a", engine.CauseCUDAOOM, now); e.ceiling != 30 {
				t.Fatalf("crash with 40 in flight: endpoint ceiling %d, want 30", e.ceiling)
			}
			d.Pause("http://a", "down")
			releaseCalls(d, calls)
			d.Resume("http://a")
			now = now.Add(5 * time.Second)
			d.Observe("http://a", engine.Metrics{MaxTotalTokens: tc.pool, TokenUsage: 0.1, Present: allMetrics}, now)
			d.mu.Lock()
			admitted := 0
			for _, l := range d.lanes {
				for admitted < 1000 && e.roomLocked(l, now) > 0 {
					d.acquireLocked(&call{ep: e, lane: l, start: now, est: 1, cancel: func(error) {}}, now)
					admitted++
				}
			}
			d.mu.Unlock()
			lanes := [2]int{e.lanes[0].ctl.Ceiling(), e.lanes[1].ctl.Ceiling()}
			if lanes != [2]int{tc.want, tc.want} || e.ceiling != tc.want || admitted != tc.want {
				t.Errorf("pool %v: lane ceilings %v, endpoint ceiling %d, %d admitted over both lanes; want %d each", tc.pool, lanes, e.ceiling, admitted, tc.want)
			}
		})
	}
}

// Requests already moved wait in the server's queue until they are
// released: a second idle server does not move them again, nor others in
// their place, and each is counted once.
func TestMoveQueuedOnce(t *testing.T) {
	eps, _ := fleet(newTracker(), ok(time.Second), "http://busy", "http://idle1", "http://idle2")
	cfg := baseConfig(newFakeStore(), eps)
	cfg.Lanes = []LaneConfig{{Name: "short", Concurrency: 100, MaxTokens: 1000}}
	d := mustNew(t, cfg)
	now := time.Unix(1000, 0)
	l := d.lanes[0]
	l.outSum, l.outN = 1000, 1
	d.Observe("http://busy", engine.Metrics{MaxTotalTokens: 100000, Queued: 3, TokenUsage: 0.95, Present: allMetrics}, now)
	d.Observe("http://idle1", engine.Metrics{MaxTotalTokens: 100000, Queued: 0, TokenUsage: 0.5, Present: allMetrics}, now)
	d.Observe("http://idle2", engine.Metrics{MaxTotalTokens: 100000, Queued: 0, TokenUsage: 0.5, Present: allMetrics}, now)
	busy := d.epByURL["http://busy"]
	cancels := map[int]int{}
	d.mu.Lock()
	for i := range 6 {
		cl := &call{ep: busy, lane: l, start: now.Add(time.Duration(i) * time.Second), est: 2000,
			cancel: func(cause error) {
				if errors.Is(cause, errMoved) {
					cancels[i]++
				}
			}}
		d.acquireLocked(cl, now)
	}
	d.moveQueuedLocked(l, now)
	d.mu.Unlock()
	if want := map[int]int{3: 1, 4: 1, 5: 1}; !maps.Equal(cancels, want) {
		t.Errorf("moves per request %v, want %v (the three newest, once each)", cancels, want)
	}
	if got := d.Snapshot().Counters.Moved; got != 3 {
		t.Errorf("moved counter %d, want 3", got)
	}
}
