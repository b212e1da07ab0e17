package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// chatterServer answers every prompt with four tokens, except prompts
// containing "chatter": those get a role chunk and then, for ever, lines
// that carry no token (a keep-alive comment or an empty chunk every gap,
// or as fast as the connection takes them when gap is 0).
type chatterServer struct {
	*httptest.Server
	line string
	gap  time.Duration
	all  bool // every request chatters, the probe too: a whole server without progress

	mu    sync.Mutex
	calls map[string]int
	bytes int64 // written to the chattering streams
}

func newChatterServer(t *testing.T, line string, gap time.Duration) *chatterServer {
	s := &chatterServer{line: line, gap: gap, calls: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

func (s *chatterServer) handle(w http.ResponseWriter, r *http.Request) {
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
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	if !s.all && !strings.Contains(id, "chatter") {
		for i := range 4 {
			time.Sleep(5 * time.Millisecond)
			sseChunk(w, fmt.Sprintf("tok%d ", i), "")
		}
		sseChunk(w, "", "stop")
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
	for r.Context().Err() == nil {
		n, err := io.WriteString(w, s.line)
		s.mu.Lock()
		s.bytes += int64(n)
		s.mu.Unlock()
		if err != nil {
			return
		}
		w.(http.Flusher).Flush()
		if s.gap > 0 {
			time.Sleep(s.gap)
		}
	}
}

func (s *chatterServer) callsOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

// TestStreamWithoutProgress is issue 29's fourth fault: for one prompt a
// server streams keep-alive comments or empty chunks for ever while it
// answers the others. The cut (the byte budget, or the idle timeout with
// no token) is that sample's fault once it repeats while the server works:
// the job ends, the sample dead-lettered with the evidence after its
// attempts, every other sample done with one attempt, the endpoint open.
func TestStreamWithoutProgress(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		gap     time.Duration
		idle    time.Duration
		wantWhy string
	}{
		{"keep-alive flood", ": keepalive\n\n", 0, 5 * time.Second, "bytes that carried no token"},
		{"empty chunk flood", `data: {"choices":[{"index":0,"delta":{"content":""}}]}` + "\n\n", 0, 5 * time.Second, "bytes that carried no token"},
		{"keep-alive every 20ms", ": keepalive\n\n", 20 * time.Millisecond, 300 * time.Millisecond, "no token for"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newChatterServer(t, tt.line, tt.gap)
			st := newFakeStore()
			ids := []string{"s-chatter"}
			for i := 1; i < 40; i++ {
				ids = append(ids, fmt.Sprintf("s-%05d", i))
			}
			ingestIDs(t, st, ids...)
			c := llm.New(llm.Config{BaseURL: srv.URL, IdleTimeout: tt.idle})
			t.Cleanup(c.Close)
			cfg := baseConfig(st, []Endpoint{{URL: srv.URL, Client: c}})
			cfg.MaxAttempts = 3
			cfg.BaseDelay, cfg.MaxDelay = 50*time.Millisecond, 200*time.Millisecond
			cfg.BreakerCooldown = 100 * time.Millisecond
			d := mustNew(t, cfg)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			if err := d.Run(ctx); err != nil {
				t.Fatalf("Run: %v", err)
			}
			took := time.Since(start)
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if diff := cmp.Diff(map[store.State]int{store.Done: len(ids) - 1, store.Dead: 1}, st.states()); diff != "" {
				t.Errorf("final states (-want +got):\n%s", diff)
			}
			p := st.get("s-chatter")
			if p.state != store.Dead || p.attempts != 3 || !strings.Contains(p.reason, tt.wantWhy) || !strings.Contains(p.reason, "fault follows this sample") {
				t.Errorf("chattering sample: %s, %d attempts, reason %q; want dead after 3 attempts with the evidence", p.state, p.attempts, p.reason)
			}
			for _, id := range ids[1:] {
				if s := st.get(id); s.attempts != 1 {
					t.Errorf("%s: %d attempts, want 1", id, s.attempts)
				}
			}
			if e := d.Snapshot().Endpoints[0]; e.Paused || e.Breaker != "closed" {
				t.Errorf("endpoint after the run: paused %v breaker %s, want open for work", e.Paused, e.Breaker)
			}
			srv.mu.Lock()
			sent := srv.bytes
			srv.mu.Unlock()
			t.Logf("job ended in %s: %d requests for the chattering sample, %d bytes streamed to it, heap %.1f -> %.1f MiB; reason: %s",
				took.Round(time.Millisecond), srv.callsOf("s-chatter"), sent, float64(before.HeapAlloc)/(1<<20), float64(after.HeapAlloc)/(1<<20), p.reason)
		})
	}
}

// TestWholeServerWithoutProgress: a server that streams keep-alives for
// every request, its probe included, makes no progress at all: an outage,
// not the samples' fault. Nothing is dead-lettered and no attempt is spent
// however long it lasts.
func TestWholeServerWithoutProgress(t *testing.T) {
	srv := newChatterServer(t, ": keepalive\n\n", 0)
	srv.all = true
	st := newFakeStore()
	var ids []string
	for i := range 6 {
		ids = append(ids, fmt.Sprintf("s-%05d", i))
	}
	ingestIDs(t, st, ids...)
	c := llm.New(llm.Config{BaseURL: srv.URL, IdleTimeout: 5 * time.Second})
	t.Cleanup(c.Close)
	cfg := baseConfig(st, []Endpoint{{URL: srv.URL, Client: c}})
	cfg.MaxAttempts = 2
	cfg.BaseDelay, cfg.MaxDelay = 50*time.Millisecond, 200*time.Millisecond
	cfg.BreakerCooldown = 100 * time.Millisecond
	cfg.DrainTimeout = time.Second
	d := mustNew(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
	defer cancel()
	_ = d.Run(ctx) // ends at the deadline: the server never progresses
	if diff := cmp.Diff(map[store.State]int{store.Pending: len(ids)}, st.states()); diff != "" {
		t.Errorf("final states (-want +got):\n%s", diff)
	}
	for _, id := range ids {
		if s := st.get(id); s.attempts != 0 {
			t.Errorf("%s: %d attempts spent (last error %q), want 0: the server made no progress for anyone", id, s.attempts, s.lastErr)
		}
	}
	snap := d.Snapshot()
	e := snap.Endpoints[0]
	if snap.Counters.ServerDown == 0 || !strings.Contains(e.LastServerDown, "carried no token") {
		t.Errorf("server-down failures %d, last %q: want the cuts counted as outages with their evidence", snap.Counters.ServerDown, e.LastServerDown)
	}
	t.Logf("%d server-down cuts over 8 s, %d requests (the probe's included); last: %s", snap.Counters.ServerDown, srv.callsTotal(), e.LastServerDown)
}

func (s *chatterServer) callsTotal() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}
