package dispatch

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script decides the fate of one request in a fake endpoint.
type script func(ctx context.Context, c call1) (llm.Result, error)

// call1 is what a script sees of a request.
type call1 struct {
	ep      string
	id      string
	n       int // 1-based: how many times this sample has been sent (all endpoints)
	req     llm.Request
	onDelta func(int)
}

// tracker watches every fake endpoint: concurrency per lane (by max_tokens),
// calls per endpoint and per sample.
type tracker struct {
	mu      sync.Mutex
	cur     map[int]int
	peak    map[int]int
	epCalls map[string]int
	epCur   map[string]int
	calls   map[string]int
}

func newTracker() *tracker {
	return &tracker{cur: map[int]int{}, peak: map[int]int{}, epCalls: map[string]int{}, epCur: map[string]int{}, calls: map[string]int{}}
}

func (tr *tracker) enter(ep, id string, maxTokens int) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.cur[maxTokens]++
	tr.peak[maxTokens] = max(tr.peak[maxTokens], tr.cur[maxTokens])
	tr.epCalls[ep]++
	tr.epCur[ep]++
	tr.calls[id]++
	return tr.calls[id]
}

func (tr *tracker) leave(ep string, maxTokens int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.cur[maxTokens]--
	tr.epCur[ep]--
}

func (tr *tracker) callsOf(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.calls[id]
}

func (tr *tracker) epCallsOf(ep string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.epCalls[ep]
}

// fakeChatter is a Chatter whose answers come from a script.
type fakeChatter struct {
	url string
	tr  *tracker
	mu  sync.Mutex
	fn  script
}

func (f *fakeChatter) setScript(fn script) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fn = fn
}

func (f *fakeChatter) Chat(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
	var body struct {
		Messages []struct{ Content string } `json:"messages"`
	}
	if err := json.Unmarshal(requestBody(req), &body); err != nil || len(body.Messages) == 0 {
		return llm.Result{}, &llm.Error{Class: llm.Malformed, Msg: "test body"}
	}
	id := body.Messages[0].Content
	n := f.tr.enter(f.url, id, req.MaxTokens)
	defer f.tr.leave(f.url, req.MaxTokens)
	f.mu.Lock()
	fn := f.fn
	f.mu.Unlock()
	return fn(ctx, call1{ep: f.url, id: id, n: n, req: req, onDelta: onDelta})
}

// generate streams chunks over d and finishes with finish; a cancelled ctx
// ends it with a server-down error, as a real client would report a reset.
func generate(ctx context.Context, c call1, d time.Duration, finish string) (llm.Result, error) {
	const chunks = 4
	start := time.Now()
	for range chunks {
		t := time.NewTimer(d / chunks)
		select {
		case <-ctx.Done():
			t.Stop()
			return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "stream cancelled", Err: ctx.Err()}
		case <-t.C:
		}
		c.onDelta(2)
	}
	return llm.Result{
		Content:      "answer to " + c.id,
		FinishReason: finish,
		Usage:        llm.Usage{PromptTokens: 10, CompletionTokens: 2 * chunks, TotalTokens: 10 + 2*chunks},
		Duration:     time.Since(start),
		TTFT:         d / chunks,
	}, nil
}

func ok(d time.Duration) script {
	return func(ctx context.Context, c call1) (llm.Result, error) { return generate(ctx, c, d, "stop") }
}

// fleet builds fake endpoints sharing one tracker.
func fleet(tr *tracker, fn script, urls ...string) ([]Endpoint, map[string]*fakeChatter) {
	var eps []Endpoint
	fakes := map[string]*fakeChatter{}
	for _, u := range urls {
		f := &fakeChatter{url: u, tr: tr, fn: fn}
		fakes[u] = f
		eps = append(eps, Endpoint{URL: u, Client: f})
	}
	return eps, fakes
}

func baseConfig(st store.Queue, eps []Endpoint) Config {
	return Config{
		Store:       st,
		Owner:       "runner-1",
		Model:       "m",
		Lanes:       []LaneConfig{{Name: "short", Concurrency: 4, MaxTokens: 100}},
		Endpoints:   eps,
		MaxAttempts: 3,
		BaseDelay:   time.Second,
		MaxDelay:    10 * time.Second,
		Logger:      slog.New(slog.DiscardHandler),
	}
}

func mustNew(t *testing.T, cfg Config) *Dispatcher {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

// runAsync starts d.Run and returns a function that waits for its error.
func runAsync(ctx context.Context, d *Dispatcher) func() error {
	errc := make(chan error, 1)
	go func() { errc <- d.Run(ctx) }()
	return func() error { return <-errc }
}

// requestBody is the body req stands for: Body, or its members joined when
// a member was given in pieces (Body nil: a conversation's next turn).
func requestBody(req llm.Request) []byte {
	if req.Body != nil || req.Members == nil {
		return req.Body
	}
	b := []byte{'{'}
	for i, m := range req.Members {
		if i > 0 {
			b = append(b, ',')
		}
		key, _ := json.Marshal(m.Key)
		b = append(append(append(b, key...), ':'), m.Bytes()...)
	}
	return append(b, '}')
}
