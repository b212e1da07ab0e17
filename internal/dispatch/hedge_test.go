package dispatch

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// backupRun is one sample in lane short (max_tokens 100, escalating to
// long, backups at half) whose short request streams 60 chunks, waits for
// the backup to start and then ends as shortEnd says; long answers with
// long. It returns the dispatcher after Run and what the fake servers saw.
type backupRun struct {
	shortEnd func() (llm.Result, error)
	long     func(ctx context.Context, n int) (llm.Result, error)
	samples  int // in lane short; 1 when 0
	shortCap int // the short lane's concurrency; 2 when 0
	// render, when set, is what the server's chat render route answers
	// for every request (a vLLM with the route).
	render []int32
	// bodies, when set, are the samples of lane short instead of samples.
	bodies map[string]string

	st     *fakeStore
	tr     *tracker
	mu     sync.Mutex
	events []string // "short end", "long start n", in order
}

func (r *backupRun) log(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, s)
}

func (r *backupRun) run(t *testing.T) *Dispatcher {
	t.Helper()
	r.st, r.tr = newFakeStore(), newTracker()
	if r.bodies != nil {
		addBodies(r.st, "short", r.bodies)
	} else {
		r.st.add("short", "s", max(r.samples, 1))
	}
	longStarted := make(chan struct{})
	var once sync.Once
	fn := func(ctx context.Context, c call1) (llm.Result, error) {
		if c.req.MaxTokens == 1000 {
			r.log("long start " + string(rune('0'+c.n)))
			once.Do(func() { close(longStarted) })
			return r.long(ctx, c.n)
		}
		for range 60 {
			time.Sleep(10 * time.Millisecond)
			c.onDelta(1)
		}
		select { // a backup starts at 50 chunks, or never (no room for one)
		case <-longStarted:
		case <-time.After(time.Second):
		}
		time.Sleep(100 * time.Millisecond)
		r.log("short end")
		return r.shortEnd()
	}
	eps, _ := fleet(r.tr, fn, "http://a")
	if r.render != nil {
		eps[0].Client = &renderingClient{Chatter: eps[0].Client, ids: r.render}
	}
	cfg := baseConfig(r.st, eps)
	cfg.Lanes = []LaneConfig{
		{Name: "short", Concurrency: max(r.shortCap, 2), MaxTokens: 100, EscalateTo: "long", BackupAt: 0.5},
		{Name: "long", Concurrency: 2, MaxTokens: 1000},
	}
	if r.shortCap > 0 {
		cfg.Lanes[0].Concurrency = r.shortCap
	}
	d := mustNew(t, cfg)
	if r.render != nil {
		d.SetServer("http://a", Server{Engine: "vllm", Render: "/v1/chat/completions/render"})
	}
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Every slot of both lanes, and of the endpoint, was given back.
	snap := d.Snapshot()
	for _, l := range snap.Lanes {
		if l.InFlight != 0 {
			t.Errorf("lane %s: %d in flight after Run, want 0", l.Name, l.InFlight)
		}
	}
	if n := snap.Endpoints[0].InFlight; n != 0 {
		t.Errorf("endpoint: %d in flight after Run, want 0", n)
	}
	return d
}

func answer(content, finish string, tokens int) llm.Result {
	return llm.Result{Content: content, FinishReason: finish, Usage: llm.Usage{PromptTokens: 10, CompletionTokens: tokens}}
}

func TestBackupAnswerStoredWhenTruncated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &backupRun{
			shortEnd: func() (llm.Result, error) { return answer("cut", "length", 100), nil },
			long: func(ctx context.Context, n int) (llm.Result, error) {
				time.Sleep(500 * time.Millisecond) // outlives the short request
				return answer("the long answer", "stop", 400), nil
			},
		}
		d := r.run(t)
		if want := []string{"long start 2", "short end"}; strings.Join(r.events, ", ") != strings.Join(want, ", ") {
			t.Errorf("requests: %q, want %q (the backup beside the first request, no third)", r.events, want)
		}
		s := r.st.get("s-00000")
		if s.state != store.Done || s.Lane != "long" || s.attempts != 1 || !strings.Contains(string(s.result.Response), "the long answer") {
			t.Errorf("sample: %s in lane %q, %d attempts, answer %s; want done in long with the backup's answer after 1 attempt",
				s.state, s.Lane, s.attempts, s.result.Response)
		}
		c := d.Snapshot().Counters
		if c.Backups != 1 || c.BackupsUsed != 1 || c.Escalated != 1 || c.Done != 1 || c.Released != 0 {
			t.Errorf("counters %+v: want 1 backup, used, 1 escalation, 1 done, nothing released", c)
		}
	})
}

func TestBackupCancelledWhenTheFirstAnswerFits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cancelled error
		r := &backupRun{
			shortEnd: func() (llm.Result, error) { return answer("short and whole", "stop", 60), nil },
			long: func(ctx context.Context, n int) (llm.Result, error) {
				<-ctx.Done()
				cancelled = context.Cause(ctx)
				return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "stream cancelled", Err: ctx.Err()}
			},
		}
		d := r.run(t)
		if cancelled != errHedgeDropped {
			t.Errorf("backup ended by %v, want cancelled as not needed", cancelled)
		}
		s := r.st.get("s-00000")
		if s.state != store.Done || s.Lane != "short" || !strings.Contains(string(s.result.Response), "short and whole") {
			t.Errorf("sample: %s in lane %q, answer %s; want done in short with the first answer", s.state, s.Lane, s.result.Response)
		}
		c := d.Snapshot().Counters
		if c.Backups != 1 || c.BackupsUsed != 0 || c.Escalated != 0 || c.Done != 1 || c.ServerDown != 0 {
			t.Errorf("counters %+v: want 1 backup, unused, no escalation, 1 done, no server-down error", c)
		}
	})
}

func TestFailedBackupEscalatesAsBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &backupRun{
			shortEnd: func() (llm.Result, error) { return answer("cut", "length", 100), nil },
			long: func(ctx context.Context, n int) (llm.Result, error) {
				if n == 2 { // the backup
					return llm.Result{}, &llm.Error{Class: llm.Retryable, Msg: "503 busy"}
				}
				return answer("escalated through the store", "stop", 300), nil
			},
		}
		d := r.run(t)
		if want := "long start 2, short end, long start 3"; strings.Join(r.events, ", ") != want {
			t.Errorf("requests: %q, want %s", r.events, want)
		}
		s := r.st.get("s-00000")
		if s.state != store.Done || s.Lane != "long" || s.attempts != 1 || !strings.Contains(string(s.result.Response), "escalated through the store") {
			t.Errorf("sample: %s in lane %q, %d attempts, answer %s; want done in long after 1 attempt (a failed backup spends none)",
				s.state, s.Lane, s.attempts, s.result.Response)
		}
		c := d.Snapshot().Counters
		if c.Backups != 1 || c.BackupsUsed != 0 || c.Escalated != 1 || c.Retried != 0 {
			t.Errorf("counters %+v: want 1 backup, unused, 1 escalation, no retry", c)
		}
	})
}

// While the store still has work of the lane, a request near its
// max_tokens gets no backup: the servers' room is the waiting work's.
func TestNoBackupWhileWorkWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &backupRun{
			samples:  2,
			shortCap: 1,
			shortEnd: func() (llm.Result, error) { return answer("cut", "length", 100), nil },
			long: func(ctx context.Context, n int) (llm.Result, error) {
				return answer("long", "stop", 300), nil
			},
		}
		d := r.run(t)
		c := d.Snapshot().Counters
		if c.Backups != 0 || c.Escalated != 2 || c.Done != 2 {
			t.Errorf("counters %+v: want no backup, 2 escalations, 2 done", c)
		}
	})
}

// A server that streams several tokens per chunk (--stream-interval) is
// learnt from its answers: chunks count as that many tokens, for the
// backup threshold and for what a shed frees.
func TestTokensPerChunk(t *testing.T) {
	e := &endpoint{}
	cl := &call{ep: e}
	cl.generated.Store(5)
	if got := cl.tokensLocked(); got != 5 {
		t.Errorf("before any answer: %v tokens, want a token per chunk (5)", got)
	}
	e.learnChunkLocked(160, 10)
	if got := cl.tokensLocked(); got != 80 {
		t.Errorf("after an answer of 160 tokens in 10 chunks: %v tokens, want 80", got)
	}
	e.learnChunkLocked(80, 10) // 8 per chunk: an eighth of the way from 16
	if e.perChunk != 15 {
		t.Errorf("tokens per chunk %v, want 15", e.perChunk)
	}
	d := &Dispatcher{}
	l := &lane{cfg: LaneConfig{Name: "short", MaxTokens: 1500, EscalateTo: "long", BackupAt: 0.5}}
	if at, step := d.hedgeChunks(l, e); at != 50 || step != 10 {
		t.Errorf("max_tokens 1500: backup threshold %d chunks, then every %d; want 50 (750 tokens) and 10 (a tenth of max_tokens)", at, step)
	}
	l.cfg.MaxTokens = 10240
	if at, step := d.hedgeChunks(l, e); at != 341 || step != 34 {
		t.Errorf("max_tokens 10240: backup threshold %d chunks, then every %d; want 341 (5120 tokens) and 34 (512 tokens)", at, step)
	}
	l.cfg.BackupAt = 0
	if at, _ := d.hedgeChunks(l, e); at != 0 {
		t.Errorf("backup_at 0: threshold %d, want none", at)
	}
}

// The backup's own answer is truncated too and its lane escalates further:
// the sample goes from the first lane straight to the third, and nothing of
// the backup is stored.
func TestTruncatedBackupEscalatesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, tr := newFakeStore(), newTracker()
		st.add("short", "s", 1)
		var mu sync.Mutex
		var sent []int
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			mu.Lock()
			sent = append(sent, c.req.MaxTokens)
			mu.Unlock()
			switch c.req.MaxTokens {
			case 100:
				for range 60 {
					time.Sleep(10 * time.Millisecond)
					c.onDelta(1)
				}
				time.Sleep(time.Second)
				return answer("cut", "length", 100), nil
			case 1000:
				return answer("cut again", "length", 1000), nil
			}
			return answer("whole", "stop", 3000), nil
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{
			{Name: "short", Concurrency: 2, MaxTokens: 100, EscalateTo: "long", BackupAt: 0.5},
			{Name: "long", Concurrency: 2, MaxTokens: 1000, EscalateTo: "xlong"},
			{Name: "xlong", Concurrency: 2, MaxTokens: 5000},
		}
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if want := []int{100, 1000, 5000}; !slices.Equal(sent, want) {
			t.Errorf("max_tokens of the requests sent: %v, want %v", sent, want)
		}
		s := st.get("s-00000")
		if s.state != store.Done || s.Lane != "xlong" || s.attempts != 1 || !strings.Contains(string(s.result.Response), "whole") {
			t.Errorf("sample: %s in lane %q, %d attempts, answer %s; want done in xlong after 1 attempt", s.state, s.Lane, s.attempts, s.result.Response)
		}
		c := d.Snapshot().Counters
		if c.Backups != 1 || c.BackupsUsed != 0 || c.Escalated != 2 || c.Done != 1 {
			t.Errorf("counters %+v: want 1 backup, unused, 2 escalations, 1 done", c)
		}
	})
}

// A backup starts only when every sample is in the store, the claims of
// both the lane and its escalation lane came back short, and Run is not
// stopping.
func TestBackupOnlyWhenBothLanesAreDry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eps, _ := fleet(newTracker(), ok(time.Second), "http://a")
		cfg := baseConfig(newFakeStore(), eps)
		cfg.Lanes = []LaneConfig{
			{Name: "short", Concurrency: 2, MaxTokens: 100, EscalateTo: "long", BackupAt: 0.5},
			{Name: "long", Concurrency: 2, MaxTokens: 1000},
		}
		ingested := make(chan struct{})
		cfg.IngestDone = ingested
		d := mustNew(t, cfg)
		short, long := d.laneByName["short"], d.laneByName["long"]
		primary := &call{ep: d.eps[0], lane: short}
		tu := &turn{body: []byte(`{"messages":[{"role":"user","content":"x"}]}`)}
		try := func(what string, shortDry, longDry, stopping, want bool) {
			t.Helper()
			d.mu.Lock()
			short.short, long.short, d.stopping = shortDry, longDry, stopping
			d.mu.Unlock()
			if got := d.tryHedge(t.Context(), primary, short, tu); got != want {
				t.Errorf("%s: backup started %v, want %v", what, got, want)
			}
		}
		try("samples still arriving", true, true, false, false)
		close(ingested)
		try("work of the lane waits", false, true, false, false)
		try("work of the escalation lane waits", true, false, false, false)
		try("Run stopping", true, true, true, false)
		try("both lanes dry", true, true, false, true)
		try("a second backup", true, true, false, false)
		d.workers.Wait()
		if c := d.Snapshot().Counters; c.Backups != 1 {
			t.Errorf("backups %d, want 1", c.Backups)
		}
	})
}

// When Run's context ends, a request passing its threshold during the
// drain starts no backup: the drain only lets what runs finish.
func TestNoBackupWhileDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, tr := newFakeStore(), newTracker()
		st.add("short", "s", 1)
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if c.req.MaxTokens == 1000 {
				return answer("long", "stop", 300), nil
			}
			for range 60 {
				time.Sleep(10 * time.Millisecond)
				c.onDelta(1)
			}
			return answer("cut", "length", 100), nil
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{
			{Name: "short", Concurrency: 2, MaxTokens: 100, EscalateTo: "long", BackupAt: 0.5},
			{Name: "long", Concurrency: 2, MaxTokens: 1000},
		}
		cfg.DrainTimeout = time.Minute
		d := mustNew(t, cfg)
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAsync(ctx, d)
		time.Sleep(200 * time.Millisecond) // 20 chunks: below the threshold of 50
		cancel()
		if err := wait(); err == nil {
			t.Fatalf("Run after cancel: nil error")
		}
		if c := d.Snapshot().Counters; c.Backups != 0 || c.Escalated != 1 {
			t.Errorf("counters %+v: want no backup and the sample escalated through the store", c)
		}
		if s := st.get("s-00000"); s.state != store.Pending || s.Lane != "long" {
			t.Errorf("sample %s in lane %q, want pending in long", s.state, s.Lane)
		}
	})
}
