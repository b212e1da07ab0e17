package sim

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

type reqKind uint8

const (
	kindChat reqKind = iota
	kindCompletion
	kindProbe // health and warm-up probes: no metrics, no request count
)

// prefixSeg is a cumulative prefix of a prompt: its hash and token count.
type prefixSeg struct {
	hash   uint64
	tokens int
}

// request is one generation. The handler owns the immutable fields and
// reads the shared ones; the scheduler goroutine owns the rest.
type request struct {
	id       string
	kind     reqKind
	prompt   int
	prefixes []prefixSeg
	maxNew   int
	plan     outputPlan
	seed     uint64
	arrived  time.Time
	priority int // the request's "priority" field (0 when absent)

	// handler-owned: how the client asked for token ids (idsNone, idsVLLM,
	// idsSGLang), which ones, and the prompt's ids
	idMode          int
	sendIn, sendOut bool
	promptIDs       []int32
	// a completion's prompt ids (sent as ids, or the text's), when token
	// ids or hidden states were asked; capture: write its hidden states
	completionIDs []int64
	capture       bool

	// scheduler-owned
	gen       int // generated tokens whose KV is held (lost on retraction)
	emitted   int // tokens generated for the client (counted once, even after a retraction)
	admitted  bool
	retracts  int
	queuedSim time.Duration

	// written by the scheduler before done is set, read by the handler after
	finishReason string
	cached       int

	// for the miss diagnosis: the messages end with an answer and a new
	// user message, and that answer's content as sent (when MissLog is set)
	laterTurn  bool
	sentAnswer []byte
	blocked    string // why admission last left it waiting at the head of the queue

	// scheduler-owned: the request's place in the pool while admitted.
	// node is the deepest cached prefix it holds locked (its prompt's KV
	// lives there, shared); tail is the prompt's uncacheable rest, and gen
	// its generated tokens, both its own.
	inPool bool
	node   *prefixNode
	hit    int
	tail   int

	avail  atomic.Int64 // tokens the client may stream
	done   atomic.Bool  // finished (or ended by the server)
	cancel atomic.Bool  // the client went away
	notify chan struct{}
}

func (r *request) wake() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// stats is a snapshot published for /get_server_info and tests.
type stats struct {
	running, waiting, used int
	genThroughput          float64
	newTokenRatio          float64
}

// scheduler is the single goroutine that owns the KV pool and the batch.
type scheduler struct {
	s     *Server
	cfg   *Config
	m     *metrics
	inbox chan *request
	wakeC chan struct{} // pokes an idle scheduler (readiness changes fault timing)

	pool, maxRun int
	waiting      []*request
	running      []*request
	used         int
	ratio        float64
	minRatio     float64
	decay        float64
	admitted     uint64
	cache        prefixCache
	diag         *missDiag // nil unless Config.MissLog is set
	evictNeed    int       // what the eviction under way was asked to free (for diag)

	realStart time.Time
	simNow    time.Duration
	timer     *time.Timer

	decodeCt       int
	logTokens      int
	logSince       time.Duration
	vllmLogAt      time.Duration
	vllmPrompt     int
	vllmGen        int
	vllmHit, vllmQ int
	tokens         int64 // tokens streamed, server-wide

	slow      float64
	slowUntil time.Duration
	hung      bool
	hangUntil time.Duration // 0 = forever
	hangSince time.Duration
	hangCode  int
	dead      bool

	simClock atomic.Int64 // simNow published for handlers
	// idleAt is when the scheduler began waiting (zero while it works), so
	// the clock on /metrics reads the present while it idles; clockMu
	// keeps it and simClock consistent for that reader.
	clockMu      sync.Mutex
	idleAt       time.Time
	tokensPub    atomic.Int64
	lastProgress atomic.Int64 // real unix nanos of the last token produced
	stuck        atomic.Bool  // hung or dead: health probes cannot pass
	deadPub      atomic.Bool  // generation is dead (zombie)
	snap         atomic.Pointer[stats]
}

func newScheduler(s *Server) *scheduler {
	cfg := &s.cfg
	sc := &scheduler{
		s:      s,
		cfg:    cfg,
		m:      s.m,
		inbox:  make(chan *request, 4096),
		wakeC:  make(chan struct{}, 1),
		pool:   cfg.kvTokens(),
		maxRun: cfg.maxRunning(),
		slow:   1,
	}
	init := math.Min(cfg.InitNewTokenRatio*cfg.ScheduleConservativeness, 1)
	sc.ratio = init
	sc.minRatio = math.Min(init*cfg.MinNewTokenRatioFactor, 1)
	sc.decay = (init - sc.minRatio) / float64(cfg.NewTokenRatioDecaySteps)
	sc.cache = newPrefixCache()
	sc.snap.Store(&stats{newTokenRatio: sc.ratio})
	return sc
}

// realDelay converts simulated time to real time.
func (sc *scheduler) realDelay(d time.Duration) time.Duration {
	return time.Duration(float64(d) / sc.cfg.Speed)
}

// reanchor maps the current simulated time to now, so idle periods add
// only their own length and CPU lag is forgotten rather than replayed.
func (sc *scheduler) reanchor() {
	sc.realStart = time.Now().Add(-sc.realDelay(sc.simNow))
}

// startIdle marks the start of a wait that passIdle ends.
func (sc *scheduler) startIdle() time.Time {
	sc.clockMu.Lock()
	defer sc.clockMu.Unlock()
	sc.idleAt = time.Now()
	return sc.idleAt
}

// passIdle adds the real time spent since t, scaled, to the simulated clock.
func (sc *scheduler) passIdle(t time.Time) {
	sc.clockMu.Lock()
	sc.simNow += time.Duration(float64(time.Since(t)) * sc.cfg.Speed)
	sc.simClock.Store(int64(sc.simNow))
	sc.idleAt = time.Time{}
	sc.clockMu.Unlock()
	sc.reanchor()
}

// clockNow is the simulated time now, as /metrics shows it: the clock of
// the last step, and while the scheduler waits for work, that plus the
// wait so far, scaled. Without the wait a scrape of an idle server read
// the time it went idle, and the first request after a long wait made the
// clock jump by all of it: a server started long before a job counted its
// wait for the others as the job's time (bench/sweep).
func (sc *scheduler) clockNow() time.Duration {
	sc.clockMu.Lock()
	defer sc.clockMu.Unlock()
	c := time.Duration(sc.simClock.Load())
	if !sc.idleAt.IsZero() {
		c += time.Duration(float64(time.Since(sc.idleAt)) * sc.cfg.Speed)
	}
	return c
}

// advance spends d of simulated time, sleeping until the real deadline so
// decisions do not depend on Speed; it reports false when ctx ended.
func (sc *scheduler) advance(ctx context.Context, d time.Duration) bool {
	if sc.slowUntil > 0 && sc.simNow >= sc.slowUntil {
		sc.slow, sc.slowUntil = 1, 0
	}
	sc.simNow += time.Duration(float64(d) * sc.slow)
	sc.simClock.Store(int64(sc.simNow))
	wait := time.Until(sc.realStart.Add(sc.realDelay(sc.simNow)))
	if wait < -10*time.Millisecond {
		sc.reanchor()
	}
	if wait < 200*time.Microsecond {
		return ctx.Err() == nil
	}
	return sc.sleep(ctx, wait)
}

func (sc *scheduler) sleep(ctx context.Context, d time.Duration) bool {
	sc.timer.Reset(d)
	select {
	case <-ctx.Done():
		sc.timer.Stop()
		return false
	case <-sc.timer.C:
		return true
	}
}

func (sc *scheduler) run(ctx context.Context) {
	sc.realStart = time.Now()
	sc.timer = time.NewTimer(time.Hour)
	sc.timer.Stop()
	defer sc.failAll()
	for ctx.Err() == nil {
		sc.drain()
		if !sc.checkFaults() {
			return
		}
		if sc.dead {
			<-ctx.Done()
			return
		}
		if sc.hung {
			if !sc.waitHang(ctx) {
				return
			}
			continue
		}
		if batch := sc.admit(); len(batch) > 0 {
			if !sc.prefill(ctx, batch) {
				return
			}
			continue
		}
		if len(sc.running) > 0 {
			if !sc.decode(ctx) {
				return
			}
			continue
		}
		if !sc.idle(ctx) {
			return
		}
	}
}

func (sc *scheduler) poke() {
	select {
	case sc.wakeC <- struct{}{}:
	default:
	}
}

func (sc *scheduler) drain() {
	for {
		select {
		case r := <-sc.inbox:
			sc.enqueue(r)
		default:
			return
		}
	}
}

func (sc *scheduler) enqueue(r *request) {
	r.queuedSim = sc.simNow
	if !sc.cfg.PriorityScheduling {
		sc.waiting = append(sc.waiting, r)
		return
	}
	// Priority scheduling: the queue in priority order, arrival order
	// within a priority (SGLang's sort by priority, then queue entry time).
	rank := sc.cfg.priorityRank
	i := len(sc.waiting)
	for i > 0 && rank(sc.waiting[i-1].priority) > rank(r.priority) {
		i--
	}
	sc.waiting = slices.Insert(sc.waiting, i, r)
}

// idle blocks until a request arrives or a timed fault is due.
func (sc *scheduler) idle(ctx context.Context) bool {
	sc.publish()
	var timeout <-chan time.Time
	if next, ok := sc.nextFaultAt(); ok {
		d := max(sc.realDelay(next-sc.simNow), time.Millisecond)
		sc.timer.Reset(d)
		timeout = sc.timer.C
		defer sc.timer.Stop()
	}
	start := sc.startIdle()
	select {
	case <-ctx.Done():
		return false
	case r := <-sc.inbox:
		sc.passIdle(start)
		sc.enqueue(r)
	case <-timeout:
		sc.passIdle(start)
	case <-sc.wakeC:
		sc.passIdle(start)
	}
	return true
}

// admit takes waiting requests that fit: the uncached part of the prompt
// plus the reserved share of max_tokens (new-token ratio) must fit in what
// running requests leave, counting cached prefixes no one holds as room
// (they are evicted when needed), as SGLang's PrefillAdder does.
func (sc *scheduler) admit() []*request {
	if len(sc.waiting) == 0 || len(sc.running) >= sc.maxRun {
		return nil
	}
	clip := sc.cfg.ClipMaxNewTokens
	reserved := 0.0
	for _, r := range sc.running {
		reserved += float64(min(r.maxNew-r.gen, clip)) * sc.ratio
	}
	taken, wanted := 0, 0.0
	budget := sc.cfg.MaxPrefillTokens
	var batch []*request
	i := 0
	for ; i < len(sc.waiting) && len(sc.running)+len(batch) < sc.maxRun; i++ {
		r := sc.waiting[i]
		if r.cancel.Load() {
			sc.abort(r)
			continue
		}
		node, hit := sc.cache.match(r.prefixes)
		hit = min(hit, max(r.prompt-1, 0))
		// Locking the hit takes its unheld nodes out of the room.
		avail := sc.pool - sc.used + sc.cache.evictable - taken - unlockedOn(node)
		need := r.prompt - hit + 1
		want := float64(need) + float64(min(r.maxNew, clip))*sc.ratio
		rem := float64(avail) - reserved - wanted
		// An empty server always takes the head, as SGLang does, so a
		// request bigger than its reservation cannot stall the queue.
		if need > avail || (want > rem && (len(sc.running) > 0 || len(batch) > 0)) {
			r.blocked = blockPool
			if need <= avail {
				r.blocked = blockReserve
			}
			break
		}
		if len(batch) > 0 && need-1 > budget {
			r.blocked = blockBudget
			break
		}
		if sc.diag != nil && !r.admitted {
			sc.diag.record(sc, r, hit)
		}
		sc.cache.lock(node)
		r.node, r.hit = node, hit
		budget -= need - 1
		wanted += want
		taken += need
		batch = append(batch, r)
	}
	sc.waiting = append(sc.waiting[:0], sc.waiting[i:]...)
	return batch
}

// place puts r's prompt in the pool: its segments join the cache (shared
// with every request holding the same prefix) and stay locked while r
// runs; the rest of the prompt is r's own.
func (sc *scheduler) place(r *request) {
	before := sc.cache.used
	node := sc.cache.insert(r.prefixes)
	sc.cache.lock(node)
	sc.cache.unlock(r.node)
	r.node = node
	keyed := 0
	if n := len(r.prefixes); n > 0 {
		keyed = min(r.prefixes[n-1].tokens, r.prompt)
	}
	r.tail = r.prompt - keyed
	r.inPool = true
	sc.used += sc.cache.used - before + r.tail
}

// release takes r out of the pool: its own tokens are freed, its prefix
// stays cached, unlocked.
func (sc *scheduler) release(r *request) {
	if r.inPool {
		sc.used -= r.tail + r.gen
		r.inPool = false
	}
	sc.cache.unlock(r.node)
	r.node, r.gen = nil, 0
}

// evict frees cached prefixes no one holds until need tokens are free.
func (sc *scheduler) evict(need int) {
	if short := need - (sc.pool - sc.used); short > 0 {
		sc.evictNeed = short
		sc.used -= sc.cache.evict(short)
	}
}

// inUse is the pool's used tokens as the engine reports them: evictable
// cached prefixes count as free (SGLang's num_used).
func (sc *scheduler) inUse() int { return sc.used - sc.cache.evictable }

func (sc *scheduler) prefill(ctx context.Context, batch []*request) bool {
	runningBefore := len(sc.running)
	newTok, hitTok := 0, 0
	for _, r := range batch {
		hit := r.hit
		if !r.admitted {
			r.cached = hit
			if r.kind != kindProbe {
				add(sc.m.promptTokens, float64(r.prompt))
				add(sc.m.cachedTokens, float64(hit))
				add(sc.m.prefixQueries, float64(r.prompt))
				add(sc.m.prefixHits, float64(hit))
				if sc.m.queueTime != nil {
					sc.m.queueTime.Observe((sc.simNow - r.queuedSim).Seconds())
				}
				sc.vllmPrompt += r.prompt
				sc.vllmQ += r.prompt
				sc.vllmHit += hit
			}
		}
		newTok += r.prompt - hit
		hitTok += hit
		sc.place(r)
	}
	sc.evict(len(batch))
	d := sc.cfg.PrefillBase + time.Duration(float64(sc.cfg.PrefillPerKToken)*float64(newTok)/1000)
	if !sc.advance(ctx, d) {
		return false
	}
	for _, r := range batch {
		r.admitted = true
		sc.admitted++
		r.gen = 1
		sc.used++
		sc.emit(r)
		if r.gen >= r.plan.target {
			sc.finish(r, r.plan.finish)
			continue
		}
		sc.running = append(sc.running, r)
	}
	sc.lastProgress.Store(time.Now().UnixNano())
	usage := float64(sc.inUse()) / float64(sc.pool)
	if sc.cfg.Engine == "sglang" {
		sc.s.log.sglang(true, "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, #running-req: %d, #queue-req: %d",
			len(batch), newTok, hitTok, usage, runningBefore, len(sc.waiting))
		hitRate := 0.0
		if newTok+hitTok > 0 {
			hitRate = float64(hitTok) / float64(newTok+hitTok)
		}
		set(sc.m.cacheHitRate, hitRate)
		sc.setGauges()
	} else {
		sc.vllmStep()
	}
	sc.publish()
	return true
}

// emit publishes newly generated tokens; regenerated ones (after a
// retraction) were already sent and are not counted again.
func (sc *scheduler) emit(r *request) {
	if r.gen <= r.emitted {
		return
	}
	n := r.gen - r.emitted
	r.emitted = r.gen
	if r.kind != kindProbe {
		sc.tokens += int64(n)
		sc.logTokens += n
		sc.vllmGen += n
		add(sc.m.genTokens, float64(n))
	}
	// The stream gets tokens every StreamInterval tokens, as SGLang's
	// --stream-interval batches them; finish hands over the rest.
	if iv := sc.cfg.StreamInterval; iv > 1 && r.emitted-int(r.avail.Load()) < iv {
		return
	}
	r.avail.Store(int64(r.emitted))
	r.wake()
}

func (sc *scheduler) finish(r *request, reason string) {
	sc.release(r)
	sc.cacheAnswer(r)
	if sc.diag != nil {
		sc.diag.finished(sc, r)
	}
	r.finishReason = reason
	r.avail.Store(int64(r.emitted))
	r.done.Store(true)
	r.wake()
	if r.kind == kindProbe {
		return
	}
	// The stop token is a generated token too (usage counts it); it costs
	// no simulated step.
	if n := stopTokens(sc.cfg.Engine, reason); n > 0 {
		sc.tokens += int64(n)
		sc.logTokens += n
		sc.vllmGen += n
		add(sc.m.genTokens, float64(n))
	}
	add(sc.m.requests, 1)
	if sc.m.success != nil {
		sc.m.success.WithLabelValues(reason).Inc()
	}
	if sc.m.e2e != nil {
		sc.m.e2e.Observe(time.Since(r.arrived).Seconds() * sc.cfg.Speed)
	}
}

// abort drops a request whose client went away.
func (sc *scheduler) abort(r *request) {
	sc.release(r)
	r.finishReason = "abort"
	r.done.Store(true)
	r.wake()
	if r.kind != kindProbe {
		add(sc.m.aborted, 1)
	}
}

func (sc *scheduler) decode(ctx context.Context) bool {
	if sc.pool-sc.used < len(sc.running) {
		sc.evict(len(sc.running))
	}
	if sc.pool-sc.used < len(sc.running) {
		sc.retract()
		sc.evict(len(sc.running))
		if len(sc.running) == 0 {
			return true
		}
	}
	b := len(sc.running)
	d := sc.cfg.DecodeBase + time.Duration(b)*sc.cfg.DecodePerReq +
		time.Duration(float64(sc.cfg.DecodePerKToken)*float64(sc.inUse())/1000)
	if !sc.advance(ctx, d) {
		return false
	}
	keep := sc.running[:0]
	for _, r := range sc.running {
		if r.cancel.Load() {
			sc.abort(r)
			continue
		}
		r.gen++
		sc.used++
		sc.emit(r)
		if r.gen >= r.plan.target {
			sc.finish(r, r.plan.finish)
			continue
		}
		keep = append(keep, r)
	}
	clear(sc.running[len(keep):])
	sc.running = keep
	sc.ratio = math.Max(sc.ratio-sc.decay, sc.minRatio)
	sc.decodeCt++
	sc.lastProgress.Store(time.Now().UnixNano())
	if sc.cfg.Engine == EngineVLLM {
		sc.vllmStep()
	} else if sc.cfg.Engine == EngineLlamaCpp {
		sc.setGauges() // llama-server reads its slots at every scrape
	} else if sc.decodeCt%sc.cfg.DecodeLogInterval == 0 {
		elapsed := (sc.simNow - sc.logSince).Seconds()
		tput := 0.0
		if elapsed > 0 {
			tput = float64(sc.logTokens) / elapsed
		}
		sc.logTokens, sc.logSince = 0, sc.simNow
		set(sc.m.genThroughput, tput)
		set(sc.m.cacheHitRate, 0)
		sc.setGauges()
		sc.s.log.sglang(true, "Decode batch, #running-req: %d, #token: %d, token usage: %.2f, cuda graph: %s, gen throughput (token/s): %.2f, #queue-req: %d",
			len(sc.running), sc.inUse(), float64(sc.inUse())/float64(sc.pool), pyBool(len(sc.running) <= 512), tput, len(sc.waiting))
		sc.snapThroughput(tput)
	}
	if sc.decodeCt%64 == 0 {
		sc.publish()
	}
	return true
}

// retract sends the newest requests back to the queue until every running
// request has RetractDecodeSteps tokens of room; their KV and decode
// progress are lost and they are re-prefilled (and re-decoded) later.
func (sc *scheduler) retract() {
	old := sc.ratio
	var back []*request
	gained, inTok, outTok := 0, 0, 0
	for len(sc.running) > 1 && sc.pool-sc.inUse() < len(sc.running)*max(sc.cfg.RetractDecodeSteps, 1) {
		r := sc.running[len(sc.running)-1]
		sc.running[len(sc.running)-1] = nil
		sc.running = sc.running[:len(sc.running)-1]
		gained += r.tail + r.gen
		inTok += r.prompt
		outTok += r.gen
		sc.release(r)
		r.retracts++
		back = append(back, r)
	}
	if len(sc.running) == 1 && sc.pool-sc.inUse() < 1 {
		// One request larger than the whole pool: SGLang ends it.
		r := sc.running[0]
		sc.running = sc.running[:0]
		sc.finish(r, "length")
	}
	if len(back) == 0 {
		return
	}
	// Oldest retracted first, ahead of requests that never ran.
	q := make([]*request, 0, len(back)+len(sc.waiting))
	for i := len(back) - 1; i >= 0; i-- {
		back[i].queuedSim = sc.simNow
		q = append(q, back[i])
	}
	sc.waiting = append(q, sc.waiting...)
	decoded, maxNew := 0, 0
	for _, r := range sc.running {
		decoded += r.gen
		maxNew += min(r.maxNew, sc.cfg.ClipMaxNewTokens)
	}
	if maxNew > 0 {
		sc.ratio = math.Min(1, float64(decoded+sc.cfg.RetractDecodeSteps*len(sc.running))/float64(maxNew))
	}
	add(sc.m.retracted, float64(len(back)))
	add(sc.m.retractedIn, float64(inTok))
	add(sc.m.retractedOut, float64(outTok))
	set(sc.m.retractedNow, float64(len(back)))
	if sc.cfg.Engine == "sglang" {
		sc.s.log.sglang(true, "KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_tokens_gained: %d, #new_token_ratio: %.4f -> %.4f",
			len(back), gained, old, sc.ratio)
	}
}

func (sc *scheduler) setGauges() {
	set(sc.m.running, float64(len(sc.running)))
	set(sc.m.queued, float64(len(sc.waiting)))
	set(sc.m.usedTokens, float64(sc.inUse()))
	set(sc.m.tokenUsage, float64(sc.inUse())/float64(sc.pool))
	set(sc.m.newTokenRatio, sc.ratio)
}

// vllmStep updates vLLM's gauges (every step, as vLLM does) and writes its
// periodic throughput line.
func (sc *scheduler) vllmStep() {
	u := float64(sc.inUse()) / float64(sc.pool)
	set(sc.m.running, float64(len(sc.running)))
	set(sc.m.queued, float64(len(sc.waiting)))
	set(sc.m.tokenUsage, u)
	set(sc.m.usageOld, u)
	if sc.m.queuedBy != nil {
		sc.m.queuedBy.WithLabelValues("capacity").Set(float64(len(sc.waiting)))
		sc.m.queuedBy.WithLabelValues("deferred").Set(0)
	}
	el := sc.simNow - sc.vllmLogAt
	if el < sc.cfg.VLLMLogInterval || el <= 0 {
		return
	}
	hit := 0.0
	if sc.vllmQ > 0 {
		hit = 100 * float64(sc.vllmHit) / float64(sc.vllmQ)
	}
	gen := float64(sc.vllmGen) / el.Seconds()
	sc.s.log.vllm("INFO", "loggers.py:123", "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
		float64(sc.vllmPrompt)/el.Seconds(), gen, len(sc.running), len(sc.waiting), 100*u, hit)
	sc.snapThroughput(gen)
	sc.vllmLogAt, sc.vllmPrompt, sc.vllmGen = sc.simNow, 0, 0
}

func (sc *scheduler) snapThroughput(t float64) {
	st := *sc.snap.Load()
	st.genThroughput = t
	sc.snap.Store(&st)
}

func (sc *scheduler) publish() {
	old := sc.snap.Load()
	sc.snap.Store(&stats{running: len(sc.running), waiting: len(sc.waiting), used: sc.inUse(),
		genThroughput: old.genThroughput, newTokenRatio: sc.ratio})
	sc.tokensPub.Store(sc.tokens)
}

// failAll ends every request when the scheduler stops.
func (sc *scheduler) failAll() {
	sc.drain()
	for _, r := range append(sc.running, sc.waiting...) {
		r.finishReason = "abort"
		r.done.Store(true)
		r.wake()
	}
	sc.running, sc.waiting = nil, nil
}
