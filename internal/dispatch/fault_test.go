package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

func TestJudgeCut(t *testing.T) {
	tests := []struct {
		name string
		ev   cutEvidence
		want cutVerdict
	}{
		{"first cut, nothing else ran", cutEvidence{isolated: true, ownChunks: 3}, cutOutage},
		{"first cut while others streamed", cutEvidence{isolated: true, othersTokens: 40}, cutRelease},
		{"first cut shared with another sample", cutEvidence{othersTokens: 40}, cutOutage},
		{"repeat, streamed before the cut", cutEvidence{repeat: true, isolated: true, ownChunks: 2}, cutSampleErr},
		{"repeat, others streamed", cutEvidence{repeat: true, isolated: true, othersTokens: 9}, cutSampleErr},
		{"repeat, the server answered others since", cutEvidence{repeat: true, isolated: true, servedSince: true}, cutSampleErr},
		{"repeat, no sign of a working server", cutEvidence{repeat: true, isolated: true}, cutOutage},
		{"repeat, others failed too (a crash)", cutEvidence{repeat: true, ownChunks: 5, othersTokens: 5}, cutOutage},
		{"repeat while the server retracted", cutEvidence{repeat: true, isolated: true, othersTokens: 9, retracted: true}, cutRelease},
	}
	for _, tt := range tests {
		if got := judgeCut(tt.ev); got != tt.want {
			t.Errorf("%s: judgeCut(%+v) = %d, want %d", tt.name, tt.ev, got, tt.want)
		}
	}
}

func TestBackpressurePolicies(t *testing.T) {
	holds := []struct {
		n          int
		retryAfter time.Duration
		want       time.Duration
	}{
		{1, 2 * time.Second, 2 * time.Second},
		{5, 2 * time.Second, 2 * time.Second}, // the server's word, however often
		{1, 0, time.Second},                   // none given: the breaker's cooldown
		{3, 0, 4 * time.Second},
		{1, time.Hour, 5 * time.Minute}, // capped at the retry delay cap
	}
	for _, h := range holds {
		if got := pressureHold(h.n, h.retryAfter, time.Second, 5*time.Minute); got != h.want {
			t.Errorf("pressureHold(%d, %v) = %v, want %v", h.n, h.retryAfter, got, h.want)
		}
	}
	caps := []struct{ cur, inFlight, want int }{
		{0, 8, 4}, {4, 8, 2}, {0, 1, 1}, {2, 1, 1}, {0, 0, 1},
	}
	for _, c := range caps {
		if got := pressureCap(c.cur, c.inFlight); got != c.want {
			t.Errorf("pressureCap(%d, %d) = %d, want %d", c.cur, c.inFlight, got, c.want)
		}
	}
	recovers := []struct{ cap, limit, want int }{
		{0, 8, 0}, {2, 8, 3}, {7, 8, 0}, {1, 2, 0},
	}
	for _, r := range recovers {
		if got := recoverCap(r.cap, r.limit); got != r.want {
			t.Errorf("recoverCap(%d, %d) = %d, want %d", r.cap, r.limit, got, r.want)
		}
	}
}

// cutServer is a stand-in OpenAI-compatible server whose /health would be
// green: it streams every prompt to the end, except prompts containing
// "poison", whose stream it cuts after two chunks (no finish_reason, no
// [DONE]) every time, and prompts containing "quiet", which go silent
// once (as a request the server retracted does) and stream the next time.
type cutServer struct {
	*httptest.Server
	gap time.Duration

	mu    sync.Mutex
	calls map[string]int
}

func newCutServer(t *testing.T, gap time.Duration) *cutServer {
	s := &cutServer{gap: gap, calls: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

func (s *cutServer) callsOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

func (s *cutServer) handle(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct{ Content string } `json:"messages"`
	}
	if json.NewDecoder(r.Body).Decode(&req) != nil || len(req.Messages) == 0 {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	id := req.Messages[0].Content
	s.mu.Lock()
	s.calls[id]++
	n := s.calls[id]
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) { sseChunk(w, delta, finish) }
	for i := range 4 {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(s.gap):
		}
		chunk(fmt.Sprintf("tok%d ", i), "")
		switch {
		case i == 1 && strings.Contains(id, "poison"):
			return // the stream ends here: no finish_reason, no [DONE]
		case i == 0 && strings.Contains(id, "quiet") && n == 1:
			<-r.Context().Done() // silent until the client gives up
			return
		}
	}
	chunk("", "stop")
	fmt.Fprint(w, "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4,\"total_tokens\":11}}\n\ndata: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

// TestOneSampleCutEveryTime is issue 22's first fault: a server that cuts
// one prompt's stream every time while it serves the rest. The job must
// finish with that sample dead-lettered (its attempts spent, with the
// evidence) and every other sample done, and the endpoint must not stay
// paused by it.
func TestOneSampleCutEveryTime(t *testing.T) {
	tests := []struct {
		name        string
		rows        int
		concurrency int
	}{
		{"200 rows at concurrency 1", 200, 1},
		{"5 rows at concurrency 2", 5, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newCutServer(t, 5*time.Millisecond)
			st := newFakeStore()
			ids := []string{"s-poison"}
			for i := 1; i < tt.rows; i++ {
				ids = append(ids, fmt.Sprintf("s-%05d", i))
			}
			ingestIDs(t, st, ids...)
			c := llm.New(llm.Config{BaseURL: srv.URL, IdleTimeout: 5 * time.Second})
			t.Cleanup(c.Close)
			cfg := baseConfig(st, []Endpoint{{URL: srv.URL, Client: c}})
			cfg.Lanes[0].Concurrency = tt.concurrency
			cfg.MaxAttempts = 3
			cfg.BaseDelay, cfg.MaxDelay = 50*time.Millisecond, 200*time.Millisecond
			cfg.BreakerCooldown = 100 * time.Millisecond
			d := mustNew(t, cfg)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			start := time.Now()
			if err := d.Run(ctx); err != nil {
				t.Fatalf("Run: %v", err)
			}
			took := time.Since(start)
			want := map[store.State]int{store.Done: tt.rows - 1, store.Dead: 1}
			if diff := cmp.Diff(want, st.states()); diff != "" {
				t.Errorf("final states (-want +got):\n%s", diff)
			}
			p := st.get("s-poison")
			if p.state != store.Dead || p.attempts != 3 || !strings.Contains(p.reason, "stream cut") || !strings.Contains(p.reason, "fault follows this sample") {
				t.Errorf("poisoned sample: %s, %d attempts, reason %q; want dead after 3 attempts with the evidence", p.state, p.attempts, p.reason)
			}
			for _, id := range ids[1:] {
				if s := st.get(id); s.attempts != 1 {
					t.Errorf("%s: %d attempts, want 1", id, s.attempts)
				}
			}
			e := d.Snapshot().Endpoints[0]
			if e.Paused || e.Breaker != "closed" {
				t.Errorf("endpoint after the run: paused %v breaker %s, want open for work", e.Paused, e.Breaker)
			}
			t.Logf("%d rows at concurrency %d: %d done, 1 dead-lettered after %d requests for it, in %s; reason: %s",
				tt.rows, tt.concurrency, st.states()[store.Done], srv.callsOf("s-poison"), took.Round(time.Millisecond), p.reason)
		})
	}
}

// TestSilentStreamOnAWorkingServer is issue 22's second fault: one stream
// goes quiet past the idle timeout while the server streams to the
// others. That is not an outage: the breaker stays closed, the request
// goes back without spending an attempt, and the next try finishes.
func TestSilentStreamOnAWorkingServer(t *testing.T) {
	srv := newCutServer(t, 20*time.Millisecond)
	st := newFakeStore()
	ids := []string{"s-quiet"}
	for i := 1; i < 30; i++ {
		ids = append(ids, fmt.Sprintf("s-%05d", i))
	}
	ingestIDs(t, st, ids...)
	c := llm.New(llm.Config{BaseURL: srv.URL, IdleTimeout: 300 * time.Millisecond})
	t.Cleanup(c.Close)
	cfg := baseConfig(st, []Endpoint{{URL: srv.URL, Client: c}})
	d := mustNew(t, cfg)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if diff := cmp.Diff(map[store.State]int{store.Done: 30}, st.states()); diff != "" {
		t.Errorf("final states (-want +got):\n%s", diff)
	}
	if q := st.get("s-quiet"); q.attempts != 1 || srv.callsOf("s-quiet") != 2 {
		t.Errorf("quiet sample: %d attempts in the store over %d requests, want 1 (the silence spent none) over 2", q.attempts, srv.callsOf("s-quiet"))
	}
	snap := d.Snapshot()
	if snap.Counters.Released != 1 || snap.Endpoints[0].LastServerDown != "" {
		t.Errorf("counters %+v, last outage %q: want the quiet request released once and the breaker never opened", snap.Counters, snap.Endpoints[0].LastServerDown)
	}
}

// TestRepeatedCrashesSpendNoAttempts: a server that cuts every stream at
// once, twice, is an outage both times, even for samples whose streams
// were cut before: no attempt is spent.
func TestRepeatedCrashesSpendNoAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 12)
		tr := newTracker()
		start := time.Now()
		var cuts atomic.Int64
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			for range 4 {
				time.Sleep(time.Second)
				now := time.Since(start)
				if (now > 2*time.Second && now <= 3*time.Second) || (now > 5*time.Second && now <= 6*time.Second) {
					cuts.Add(1)
					return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "chat stream: stream cut before finish_reason"}
				}
				c.onDelta(1)
			}
			return llm.Result{Content: "ok", FinishReason: "stop"}, nil
		}, "http://a")
		d := mustNew(t, baseConfig(st, eps))
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i := range 12 {
			if s := st.get(sampleID("s", i)); s.state != store.Done || s.attempts != 1 {
				t.Errorf("%s: %s with %d attempts, want done with 1 (the outages spent none)", s.ID, s.state, s.attempts)
			}
		}
		if n := d.Snapshot().Counters.ServerDown; n != cuts.Load() || n < 5 {
			t.Errorf("server-down failures counted = %d, want every cut stream (%d, both crashes)", n, cuts.Load())
		}
	})
}

// pressureChatter stands in for the llm client against a server that
// answers 429 with Retry-After until recoverAt: it returns what the client
// returns for it (llm.Backpressure with RetryAfter) and records when
// every request was sent.
type pressureChatter struct {
	retryAfter time.Duration
	recoverAt  time.Time

	mu   sync.Mutex
	sent []time.Time
	n429 int
}

func (p *pressureChatter) Chat(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
	p.mu.Lock()
	p.sent = append(p.sent, time.Now())
	refuse := time.Now().Before(p.recoverAt)
	if refuse {
		p.n429++
	}
	p.mu.Unlock()
	if refuse {
		return llm.Result{}, &llm.Error{Class: llm.Backpressure, Status: 429, Msg: "Too Many Requests", RetryAfter: p.retryAfter}
	}
	time.Sleep(500 * time.Millisecond)
	onDelta(1)
	return llm.Result{Content: "ok", FinishReason: "stop"}, nil
}

// TestBackpressureHonoursRetryAfter is issue 22's third fault: a server
// that answers 429 with Retry-After: 2 for 25 s and then serves. Nothing
// is dead-lettered, no attempt is spent on a 429, and no request reaches
// the server sooner than Retry-After after a 429.
func TestBackpressureHonoursRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 40)
		p := &pressureChatter{retryAfter: 2 * time.Second, recoverAt: time.Now().Add(25 * time.Second)}
		cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: p}})
		cfg.Lanes[0].Concurrency = 8
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if diff := cmp.Diff(map[store.State]int{store.Done: 40}, st.states()); diff != "" {
			t.Errorf("final states (-want +got):\n%s", diff)
		}
		for i := range 40 {
			if s := st.get(sampleID("s", i)); s.attempts != 1 {
				t.Errorf("%s: %d attempts, want 1 (429s spend none)", s.ID, s.attempts)
			}
		}
		// After each 429 burst the next request waits Retry-After.
		p.mu.Lock()
		defer p.mu.Unlock()
		minGap := time.Duration(1<<63 - 1)
		for i := 1; i < len(p.sent); i++ {
			if gap := p.sent[i].Sub(p.sent[i-1]); gap > 0 && p.sent[i-1].Before(p.recoverAt) {
				minGap = min(minGap, gap)
			}
		}
		if minGap < p.retryAfter {
			t.Errorf("a request went out %v after a 429 asking for %v", minGap, p.retryAfter)
		}
		t.Logf("%d requests, %d answered 429; smallest gap after a 429: %v", len(p.sent), p.n429, minGap)
		snap := d.Snapshot()
		if snap.Counters.DeadLettered != 0 || snap.Counters.Retried != 0 {
			t.Errorf("counters %+v: want nothing retried or dead", snap.Counters)
		}
	})
}

// TestBackpressureCutsTheLoad: a 429 halves the fixed lanes' share of that
// endpoint, and answers grow it back by one each.
func TestBackpressureCutsTheLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 60)
		tr := newTracker()
		start := time.Now()
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if time.Since(start) < 2*time.Second && c.n == 1 {
				time.Sleep(time.Second)
				return llm.Result{}, &llm.Error{Class: llm.Backpressure, Status: 429, RetryAfter: time.Second}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes[0].Concurrency = 8
		d := mustNew(t, cfg)
		wait := runAsync(t.Context(), d)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		es := d.Snapshot().Endpoints[0]
		if held := es.HeldUntil; !held.Equal(start.Add(2 * time.Second)) {
			t.Errorf("held until %v after a 429 at 1 s asking for 1 s, want %v", held.Sub(start), 2*time.Second)
		}
		// What the views show of it (issue 30 item 8): since when, why, the cap.
		if !es.HoldSince.Equal(start.Add(time.Second)) || !strings.Contains(es.HoldReason, "429") ||
			!strings.Contains(es.HoldReason, "Retry-After 1s") || es.FixedCap != 4 {
			t.Errorf("hold since %v, reason %q, fixed cap %d; want since 1 s, the 429 with its Retry-After 1s, cap 4 (half of 8)",
				es.HoldSince.Sub(start), es.HoldReason, es.FixedCap)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		tr.mu.Lock()
		cur := tr.cur[100]
		tr.mu.Unlock()
		if cur > 4 {
			t.Errorf("in flight after a 429 with 8 in flight = %d, want at most 4", cur)
		}
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if got := st.states()[store.Done]; got != 60 {
			t.Errorf("done %d of 60", got)
		}
		if cap := d.eps[0].fixedCap; cap != 0 {
			t.Errorf("cap after the run = %d, want lifted (0) once answers came back", cap)
		}
	})
}

// TestGuardStopsOnRefusals: before any request is accepted, identical
// refusals of the request itself (a wrong model, a bad key, a server
// failing everything with the same 500) stop Run within a few requests,
// with every sample back to pending and no attempt spent.
func TestGuardStopsOnRefusals(t *testing.T) {
	tests := []struct {
		name   string
		err    *llm.Error
		rows   int
		status int
	}{
		{"wrong model", &llm.Error{Class: llm.ServerDown, Status: 404, Msg: "The model `wrong-model` does not exist."}, 100, 404},
		{"bad key", &llm.Error{Class: llm.ServerDown, Status: 401, Msg: "Invalid API key"}, 100, 401},
		{"forbidden", &llm.Error{Class: llm.ServerDown, Status: 403, Msg: "forbidden"}, 100, 403},
		{"500 to everything", &llm.Error{Class: llm.Retryable, Status: 500, Msg: "Internal Server Error"}, 100, 500},
		{"fewer samples than the guard counts", &llm.Error{Class: llm.ServerDown, Status: 404, Msg: "no such model"}, 3, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				st.add("short", "s", tt.rows)
				tr := newTracker()
				eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
					time.Sleep(100 * time.Millisecond)
					return llm.Result{}, tt.err
				}, "http://a")
				cfg := baseConfig(st, eps)
				cfg.PoisonAfter = 5
				d := mustNew(t, cfg)
				err := d.Run(t.Context())
				var pe *PoisonError
				if !errors.As(err, &pe) {
					t.Fatalf("Run = %v, want a PoisonError", err)
				}
				if pe.Status != tt.status || pe.Endpoint != "http://a" || !strings.Contains(err.Error(), fmt.Sprintf("HTTP %d: %s", tt.status, tt.err.Msg)) || !pe.RequeueOK {
					t.Errorf("error %+v (%v): want status %d from http://a naming the server's message", pe, err, tt.status)
				}
				sent := tr.epCallsOf("http://a")
				if sent > 5+4 {
					t.Errorf("%d requests before stopping, want at most the guard's 5 plus the lane's 4", sent)
				}
				if diff := cmp.Diff(map[store.State]int{store.Pending: tt.rows}, st.states()); diff != "" {
					t.Errorf("states after the stop (-want +got):\n%s", diff)
				}
				for i := range tt.rows {
					if s := st.get(sampleID("s", i)); s.attempts != 0 {
						t.Errorf("%s: %d attempts spent, want 0", s.ID, s.attempts)
					}
				}
				t.Logf("stopped after %d requests: %v", sent, err)
			})
		})
	}
}

// TestRefusalAfterAcceptanceIsAnOutage: once the server accepted a request
// the guard is off; a later 404 pauses the endpoint as before (the model
// may come back), it does not stop the job or spend attempts.
func TestRefusalAfterAcceptanceIsAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 20)
		tr := newTracker()
		start := time.Now()
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if el := time.Since(start); el > 2*time.Second && el < 10*time.Second {
				return llm.Result{}, &llm.Error{Class: llm.ServerDown, Status: 404, Msg: "model unloaded"}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.PoisonAfter = 3
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i := range 20 {
			if s := st.get(sampleID("s", i)); s.state != store.Done || s.attempts != 1 {
				t.Errorf("%s: %s, %d attempts; want done with 1", s.ID, s.state, s.attempts)
			}
		}
	})
}

// retryAfterClient stands in for the llm client's backpressure class until
// it produces it: a 429 the client reports as retryable comes back as
// llm.Backpressure with the Retry-After the stand-in server sends.
type retryAfterClient struct {
	*llm.Client
	retryAfter time.Duration
}

func (c retryAfterClient) Chat(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
	res, err := c.Client.Chat(ctx, req, onDelta)
	var e *llm.Error
	if errors.As(err, &e) && e.Status == http.StatusTooManyRequests {
		return res, &llm.Error{Class: llm.Backpressure, Status: e.Status, Msg: e.Msg, RetryAfter: c.retryAfter}
	}
	return res, err
}

// TestBackpressureOverHTTP: a stand-in server answering 429 with
// Retry-After: 1 for its first 3 s, then streaming: every sample is done
// with one attempt, and the server sees no request sooner than
// Retry-After after a 429 it sent.
func TestBackpressureOverHTTP(t *testing.T) {
	var mu sync.Mutex
	var log []struct {
		at  time.Time
		got int
	}
	var until time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		mu.Lock()
		if until.IsZero() {
			until = now.Add(3 * time.Second)
		}
		refuse := now.Before(until)
		status := http.StatusOK
		if refuse {
			status = http.StatusTooManyRequests
		}
		log = append(log, struct {
			at  time.Time
			got int
		}{now, status})
		mu.Unlock()
		if refuse {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"Too Many Requests"}}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		sseChunk(w, "hi", "stop")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	st := newFakeStore()
	st.add("short", "s", 30)
	c := llm.New(llm.Config{BaseURL: srv.URL})
	t.Cleanup(c.Close)
	cfg := baseConfig(st, []Endpoint{{URL: srv.URL, Client: retryAfterClient{Client: c, retryAfter: time.Second}}})
	d := mustNew(t, cfg)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if diff := cmp.Diff(map[store.State]int{store.Done: 30}, st.states()); diff != "" {
		t.Errorf("final states (-want +got):\n%s", diff)
	}
	for i := range 30 {
		if s := st.get(sampleID("s", i)); s.attempts != 1 {
			t.Errorf("%s: %d attempts, want 1", s.ID, s.attempts)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// Requests sent together (before the first 429 came back) arrive
	// together: a burst is requests less than 200 ms apart, and after a
	// burst with a 429 the next burst must wait Retry-After.
	refused, minGap := 0, time.Hour
	burst429 := false
	for i, r := range log {
		if i > 0 && r.at.Sub(log[i-1].at) >= 200*time.Millisecond {
			if burst429 {
				minGap = min(minGap, r.at.Sub(log[i-1].at))
			}
			burst429 = false
		}
		if r.got == http.StatusTooManyRequests {
			refused++
			burst429 = true
		}
	}
	if refused == 0 || minGap < time.Second {
		t.Errorf("%d answered 429; smallest gap between a burst with a 429 and the next request %v, want >= 1s", refused, minGap)
	}
	t.Logf("%d requests, %d answered 429 (Retry-After: 1); smallest gap after a burst with a 429: %v", len(log), refused, minGap)
}

// TestOneRefusingEndpointAmongWorkingOnes: a server that refuses the
// model while another serves it is that server's outage: the job is not
// stopped, the refusing endpoint's breaker takes it out, nothing is spent.
func TestOneRefusingEndpointAmongWorkingOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 40)
		tr := newTracker()
		eps, fakes := fleet(tr, ok(2*time.Second), "http://good", "http://wrong")
		fakes["http://wrong"].setScript(func(ctx context.Context, c call1) (llm.Result, error) {
			return llm.Result{}, &llm.Error{Class: llm.ServerDown, Status: 404, Msg: "no such model"}
		})
		cfg := baseConfig(st, eps)
		cfg.PoisonAfter = 3
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i := range 40 {
			if s := st.get(sampleID("s", i)); s.state != store.Done || s.attempts != 1 || s.result.Endpoint != "http://good" {
				t.Errorf("%s: %s, %d attempts on %s; want done once on http://good", s.ID, s.state, s.attempts, s.result.Endpoint)
			}
		}
		if n := tr.epCallsOf("http://wrong"); n > 10 {
			t.Errorf("%d requests to the refusing endpoint, want its breaker to hold them to a few probes", n)
		}
	})
}

// TestFirstCutOfACrashSpendsNoAttempt is the crash tests' rare second
// attempt (issue 29 item 9): a crash cuts every stream, but one goroutine
// notices first. Its sample, cut before its neighbours were marked, looked
// alone on a working server (the others had streamed meanwhile), was
// released free and sent again at once; the dead server refused it before
// the other cuts were judged, and that second failure, a repeat, was blamed
// on the sample. Every cut of a crash is an outage: no attempt is spent.
func TestFirstCutOfACrashSpendsNoAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 8)
		tr := newTracker()
		start := time.Now()
		crash, back := start.Add(time.Second), start.Add(3*time.Second)
		first := sampleID("s", 0)
		eps, _ := fleet(tr, func(ctx context.Context, c call1) (llm.Result, error) {
			if now := time.Now(); !now.Before(crash) && now.Before(back) {
				time.Sleep(10 * time.Millisecond) // the dead server refuses the connection
				return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "chat: connect: connection refused"}
			}
			sent := time.Now()
			for range 40 {
				time.Sleep(50 * time.Millisecond)
				if sent.Before(crash) && !time.Now().Before(crash) {
					if c.id == first {
						return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "chat stream: unexpected EOF"}
					}
					// The others read what was buffered before their cut.
					c.onDelta(1)
					time.Sleep(300 * time.Millisecond)
					return llm.Result{}, &llm.Error{Class: llm.ServerDown, Msg: "chat stream: unexpected EOF"}
				}
				c.onDelta(1)
			}
			return llm.Result{Content: "ok", FinishReason: "stop", Usage: llm.Usage{CompletionTokens: 40}}, nil
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes[0].Concurrency = 8
		cfg.BreakerCooldown = 500 * time.Millisecond
		d := mustNew(t, cfg)
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i := range 8 {
			if s := st.get(sampleID("s", i)); s.state != store.Done || s.attempts != 1 {
				t.Errorf("%s: %s with %d attempts (last error %q), want done with 1: a crash spends none", s.ID, s.state, s.attempts, s.lastErr)
			}
		}
		if n := tr.callsOf(first); n < 2 {
			t.Errorf("%s was sent %d times, want the cut one and the one that finished", first, n)
		}
	})
}
