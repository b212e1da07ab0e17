package sim

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Faults chosen by a request's content (cut) or by when it arrives
// (throttle), rather than by how many requests came before it.

// throttle refuses the n-th generation request when a throttle fault is
// on: Status with a Retry-After, as an engine (or a proxy in front of
// one) shedding load does. It reports whether it answered.
func (s *Server) throttle(w http.ResponseWriter, n int64) bool {
	ready := s.readyAt.Load()
	if ready == 0 {
		return false
	}
	// The scheduler's clock stands still while it idles, and a throttled
	// server idles; the window is measured on the wall clock, scaled.
	since := time.Duration(float64(time.Since(time.Unix(0, ready))) * s.cfg.Speed)
	for _, f := range s.throttles {
		if since < f.At || (f.For > 0 && since >= f.At+f.For) || !chance(s.cfg.Seed, n, f.Probability) {
			continue
		}
		msg := f.Message
		if msg == "" {
			msg = http.StatusText(f.Status)
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(f.RetryAfter.Seconds()))))
		writeError(w, f.Status, msg)
		return true
	}
	return false
}

// chance is true for a share p of request numbers, the same ones for a
// given seed.
func chance(seed, n int64, p float64) bool {
	if p >= 1 {
		return true
	}
	h := splitmix64(uint64(seed) ^ uint64(n)*0x9e3779b97f4a7c15)
	return float64(h>>11)/(1<<53) < p
}

// cutAt is how many tokens the request gets before its connection is cut
// by a cut fault matching its last user message, or -1.
func (s *Server) cutAt(in *genRequest) int {
	if len(s.cuts) == 0 {
		return -1
	}
	text := lastUserText(in)
	for _, f := range s.cuts {
		if !strings.Contains(text, f.Prompt) {
			continue
		}
		if f.Count > 0 {
			if left := f.remaining.Add(-1); left < 0 {
				continue
			}
		}
		return f.Tokens
	}
	return -1
}

// lastUserText is the text of the last user message: a string content, or
// the text parts of a list.
func lastUserText(in *genRequest) string {
	for i := len(in.Messages) - 1; i >= 0; i-- {
		m := in.Messages[i]
		if m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var parts []struct {
			Text string `json:"text"`
		}
		_ = json.Unmarshal(m.Content, &parts)
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

// broken answers the n-th generation request with a broken fault's error
// once the fault has begun and until its For has passed (wall clock,
// scaled, like a throttle's window). It reports whether it answered.
func (s *Server) broken(w http.ResponseWriter, n int64) bool {
	ready := s.readyAt.Load()
	if ready == 0 {
		return false
	}
	now := time.Now().UnixNano()
	for _, f := range s.brokens {
		begin := ready + int64(float64(f.At)/s.cfg.Speed)
		if f.AfterRequests > 0 {
			if n <= int64(f.AfterRequests) {
				continue
			}
			f.firedAt.CompareAndSwap(0, now)
			begin = f.firedAt.Load()
		}
		if now < begin || (f.For > 0 && now >= begin+int64(float64(f.For)/s.cfg.Speed)) {
			continue
		}
		msg := f.Message
		if msg == "" {
			msg = "Internal server error"
		}
		writeError(w, f.Status, msg)
		return true
	}
	return false
}
