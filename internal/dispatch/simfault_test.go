package dispatch

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
)

// simArrival is one request the simulator saw: whose, when, and its status.
type simArrival struct {
	id     string
	at     time.Time
	status int
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// Unwrap lets http.ResponseController reach the connection (the cut fault
// aborts it).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// simServer runs the real simulator with cfg behind httptest, with the
// real llm client, logging each generation request's sample (the last
// user message) and status.
func simServer(t *testing.T, cfg sim.Config) (Endpoint, func() []simArrival) {
	t.Helper()
	s, err := sim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log []simArrival
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		json.Unmarshal(body, &req)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		at := time.Now()
		defer func() {
			if len(req.Messages) > 0 {
				mu.Lock()
				log = append(log, simArrival{id: req.Messages[len(req.Messages)-1].Content, at: at, status: sw.status})
				mu.Unlock()
			}
		}()
		h.ServeHTTP(sw, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	c := llm.New(llm.Config{BaseURL: srv.URL, IdleTimeout: 10 * time.Second})
	t.Cleanup(c.Close)
	return Endpoint{URL: srv.URL, Client: c}, func() []simArrival {
		mu.Lock()
		defer mu.Unlock()
		return append([]simArrival(nil), log...)
	}
}

func fastSim() sim.Config {
	c := sim.DefaultConfig()
	c.Speed = 1000
	c.LoadTime, c.WarmupTime = 0, 0
	c.OutputMean = 20
	c.ModelName = "m"
	return c
}

// TestSimThrottleRetryAfter is issue 22's third fault on the simulator: it
// answers 429 with Retry-After: 2 for its first 5 s (real time), and the
// real client reports Backpressure with that wait. Nothing is
// dead-lettered, no attempt is spent, and no sample is sent again sooner
// than 2 s after its 429.
func TestSimThrottleRetryAfter(t *testing.T) {
	cfg := fastSim()
	cfg.ThrottleFor = 5000 * time.Second // 5 s at speed 1000
	cfg.ThrottleRetryAfter = 2 * time.Second
	ep, arrivals := simServer(t, cfg)
	st := newFakeStore()
	st.add("short", "s", 20)
	d := mustNew(t, baseConfig(st, []Endpoint{ep}))
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if diff := cmp.Diff(map[store.State]int{store.Done: 20}, st.states()); diff != "" {
		t.Errorf("final states (-want +got):\n%s", diff)
	}
	for i := range 20 {
		if s := st.get(sampleID("s", i)); s.attempts != 1 {
			t.Errorf("%s: %d attempts, want 1 (a 429 spends none)", s.ID, s.attempts)
		}
	}
	// Each sample's next request after a 429 it got.
	last := map[string]simArrival{}
	var delays []time.Duration
	refused := 0
	for _, a := range arrivals() {
		if p, ok := last[a.id]; ok && p.status == http.StatusTooManyRequests {
			delays = append(delays, a.at.Sub(p.at))
		}
		if a.status == http.StatusTooManyRequests {
			refused++
		}
		last[a.id] = a
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	if refused == 0 || len(delays) == 0 {
		t.Fatalf("%d requests answered 429, %d retried; want some of each", refused, len(delays))
	}
	// The server stamps the 429 a moment before the client reads it.
	if delays[0] < 1950*time.Millisecond {
		t.Errorf("a sample went out again %v after its 429 (Retry-After: 2)", delays[0])
	}
	t.Logf("%d requests answered 429 (Retry-After: 2); retry delays of the samples refused: %v", refused, delays)
}

// TestSimCutPrompt is issue 22's first fault on the simulator: it cuts the
// stream of one prompt every time and answers every other. The job ends
// with that sample dead-lettered, with the evidence, and the rest done.
func TestSimCutPrompt(t *testing.T) {
	cfg := fastSim()
	cfg.CutPrompt = "s-00007"
	ep, arrivals := simServer(t, cfg)
	st := newFakeStore()
	st.add("short", "s", 40)
	c := baseConfig(st, []Endpoint{ep})
	c.Lanes[0].Concurrency = 2
	c.BaseDelay = 100 * time.Millisecond
	d := mustNew(t, c)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for i := range 40 {
		s := st.get(sampleID("s", i))
		switch {
		case i == 7 && (s.state != store.Dead || !strings.Contains(s.reason, "the fault follows this sample")):
			t.Errorf("%s: %s with reason %q, want dead with the cut as evidence", s.ID, s.state, s.reason)
		case i != 7 && (s.state != store.Done || s.attempts != 1):
			t.Errorf("%s: %s after %d attempts, want done after 1", s.ID, s.state, s.attempts)
		}
	}
	n := 0
	for _, a := range arrivals() {
		if a.id == "s-00007" {
			n++
		}
	}
	t.Logf("s-00007 dead after %d requests: %q", n, st.get("s-00007").reason)
}
