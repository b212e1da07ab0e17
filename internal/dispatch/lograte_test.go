package dispatch

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/llm"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(msg string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, "msg=\""+msg+"\"") || strings.Contains(l, "msg="+msg+" ") {
			out = append(out, l)
		}
	}
	return out
}

func TestLogRate(t *testing.T) {
	r := newLogRate(10 * time.Second)
	t0 := time.Now()
	steps := []struct {
		key      string
		at       time.Duration
		wantOK   bool
		wantHeld int
	}{
		{"a", 0, true, 0},
		{"a", time.Second, false, 0},
		{"b", time.Second, true, 0}, // another key has its own budget
		{"a", 5 * time.Second, false, 0},
		{"a", 10 * time.Second, true, 2}, // the two held back are reported
		{"a", 11 * time.Second, false, 0},
	}
	for i, s := range steps {
		ok, held := r.allow(s.key, t0.Add(s.at))
		if ok != s.wantOK || held != s.wantHeld {
			t.Errorf("step %d (%s at %v): allow = %v, %d; want %v, %d", i, s.key, s.at, ok, held, s.wantOK, s.wantHeld)
		}
	}
}

// Retries of in-band stream errors and the adaptive limit's decisions
// are in the run log, one line per event, rate-limited.
func TestRetriesAndLimitDecisionsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.add("short", "s", 20)
		var buf syncBuffer
		eps, _ := fleet(newTracker(), func(ctx context.Context, c call1) (llm.Result, error) {
			if c.n == 1 {
				return llm.Result{}, &llm.Error{Class: llm.Retryable, Msg: "chat stream: server error (code 500): slot unavailable"}
			}
			return generate(ctx, c, time.Second, "stop")
		}, "http://a")
		cfg := baseConfig(st, eps)
		cfg.Lanes = []LaneConfig{{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 100}}
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		d := mustNew(t, cfg)
		wait := runAsync(t.Context(), d)
		at := time.Now()
		for range 4 {
			time.Sleep(5 * time.Second)
			at = at.Add(5 * time.Second)
			d.Observe("http://a", engine.Metrics{Running: 4, Queued: 0, TokenUsage: 0.2,
				Present: engine.FieldRunning | engine.FieldQueued | engine.FieldTokenUsage}, at)
		}
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		retries := buf.lines("request failed")
		if len(retries) == 0 || len(retries) > 4 || !strings.Contains(retries[0], "slot unavailable") || !strings.Contains(retries[0], "class=retryable") {
			t.Errorf("retry lines = %q; want between 1 and 4 (20 retries, one line per 10 s) naming the in-band error", retries)
		}
		limits := buf.lines("limit")
		if len(limits) == 0 || !strings.Contains(limits[0], "action=raise") || !strings.Contains(limits[0], "lane=short") {
			t.Errorf("limit lines = %q; want the raises logged", limits)
		}
	})
}
