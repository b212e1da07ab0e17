package dispatch

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/storetest"
)

// sseServer is a minimal OpenAI-compatible streaming server: chunks tokens
// every gap, answers 503 while down503 > 0 (counting down), and 400 for
// prompts containing "toolong".
type sseServer struct {
	*httptest.Server
	chunks  int
	gap     time.Duration
	down503 atomic.Int32
	served  atomic.Int32
}

func newSSEServer(t *testing.T, chunks int, gap time.Duration) *sseServer {
	s := &sseServer{chunks: chunks, gap: gap}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

func (s *sseServer) handle(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct{ Content string } `json:"messages"`
		Stream   bool                       `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 || !req.Stream {
		http.Error(w, `{"error":{"message":"bad body"}}`, http.StatusBadRequest)
		return
	}
	if s.down503.Add(-1) >= 0 {
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return
	}
	if strings.Contains(req.Messages[0].Content, "toolong") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"object":"error","message":"This model's maximum context length is 8192 tokens","code":400}`)
		return
	}
	s.served.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) { sseChunk(w, delta, finish) }
	for i := range s.chunks {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(s.gap):
		}
		chunk(fmt.Sprintf("tok%d ", i), "")
	}
	chunk("", "stop")
	fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", s.chunks, 7+s.chunks)
	fmt.Fprint(w, "data: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

// sseChunk writes and flushes one streamed chunk carrying delta, with
// finish as its finish_reason ("" = none yet).
func sseChunk(w http.ResponseWriter, delta, finish string) {
	fin := "null"
	if finish != "" {
		fin = `"` + finish + `"`
	}
	fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", delta, fin)
	w.(http.Flusher).Flush()
}

func sseEndpoints(t *testing.T, servers ...*sseServer) []Endpoint {
	var eps []Endpoint
	for _, s := range servers {
		c := llm.New(llm.Config{BaseURL: s.URL, IdleTimeout: 5 * time.Second})
		t.Cleanup(c.Close)
		eps = append(eps, Endpoint{URL: s.URL, Client: c})
	}
	return eps
}

func ingestIDs(t *testing.T, st storetest.QueueStore, ids ...string) {
	t.Helper()
	var ns []store.NewSample
	for _, id := range ids {
		ns = append(ns, store.NewSample{ID: id, Partition: "p", Lane: "short", Body: []byte(`{"messages":[{"role":"user","content":"` + id + `"}]}`)})
	}
	if _, err := st.Ingest(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
}

// TestSSEServers runs the dispatcher with the real llm client against two
// streaming HTTP servers, one of which answers 503 for a while.
func TestSSEServers(t *testing.T) {
	a, b := newSSEServer(t, 5, 5*time.Millisecond), newSSEServer(t, 5, 5*time.Millisecond)
	b.down503.Store(3) // the breaker's probes at +10 ms and +30 ms see it recover
	st := newFakeStore()
	var ids []string
	for i := range 60 {
		ids = append(ids, fmt.Sprintf("s-%05d", i))
	}
	ids = append(ids, "s-toolong")
	ingestIDs(t, st, ids...)
	cfg := baseConfig(st, sseEndpoints(t, a, b))
	cfg.BreakerCooldown = 10 * time.Millisecond
	d := mustNew(t, cfg)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, id := range ids[:60] {
		s := st.get(id)
		if s.state != store.Done || s.attempts != 1 || s.result.CompletionTokens != 5 || s.result.FinishReason != "stop" {
			t.Errorf("%s: %s, %d attempts, %d tokens, finish %q; want done, 1 attempt, 5 tokens, stop",
				id, s.state, s.attempts, s.result.CompletionTokens, s.result.FinishReason)
		}
		var resp struct {
			Content  string `json:"content"`
			Endpoint string `json:"endpoint"`
		}
		if err := json.Unmarshal(s.result.Response, &resp); err != nil || resp.Content != "tok0 tok1 tok2 tok3 tok4 " || resp.Endpoint != s.result.Endpoint {
			t.Errorf("%s: stored response %s (%v), want the streamed content and endpoint", id, s.result.Response, err)
		}
	}
	if s := st.get("s-toolong"); s.state != store.Dead || !strings.Contains(s.reason, "maximum context length") {
		t.Errorf("s-toolong: %s with reason %q, want dead with the server's message", s.state, s.reason)
	}
	snap := d.Snapshot()
	if got := snap.Endpoints[1].Errors["server-down"]; got == 0 {
		t.Errorf("server-down errors on the 503 endpoint = %d, want > 0", got)
	}
	if snap.Endpoints[1].Breaker != "closed" || b.served.Load() == 0 {
		t.Errorf("recovered endpoint: breaker %s, %d streams served; want closed and serving", snap.Endpoints[1].Breaker, b.served.Load())
	}
	if got := a.served.Load() + b.served.Load(); got != 60 {
		t.Errorf("streams served = %d, want 60", got)
	}
	if tok := snap.Endpoints[0].TokensTotal + snap.Endpoints[1].TokensTotal; tok < 60*5 {
		t.Errorf("TokensTotal = %d, want >= %d", tok, 60*5)
	}
}

// TestSSEPauseMidStream pauses a server while streams are open: the real
// client's requests are cancelled, their samples released without spending
// attempts, and after Resume the job completes.
func TestSSEPauseMidStream(t *testing.T) {
	a := newSSEServer(t, 40, 5*time.Millisecond)
	st := newFakeStore()
	var ids []string
	for i := range 12 {
		ids = append(ids, fmt.Sprintf("s-%05d", i))
	}
	ingestIDs(t, st, ids...)
	d := mustNew(t, baseConfig(st, sseEndpoints(t, a)))
	wait := runAsync(t.Context(), d)
	for d.Snapshot().Endpoints[0].LastTokenAt.IsZero() {
		time.Sleep(time.Millisecond)
	}
	d.Pause(a.URL, "test")
	for d.Snapshot().Counters.Released < 4 {
		time.Sleep(time.Millisecond)
	}
	snap := d.Snapshot()
	if snap.Endpoints[0].InFlight != 0 || len(snap.Endpoints[0].Errors) != 0 || snap.Counters.Done != 0 {
		t.Errorf("after pause: %+v %+v, want nothing in flight, no errors, nothing done", snap.Endpoints[0], snap.Counters)
	}
	for _, id := range ids[:4] {
		if s := st.get(id); s.state != store.Pending || s.attempts != 0 {
			t.Errorf("%s after pause: %s with %d attempts, want pending with 0", id, s.state, s.attempts)
		}
	}
	d.Resume(a.URL)
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, id := range ids {
		if s := st.get(id); s.state != store.Done || s.attempts != 1 {
			t.Errorf("%s: %s with %d attempts, want done with 1", id, s.state, s.attempts)
		}
	}
}
