package dispatch

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// poisonGuard stops a job whose configuration the server refuses. Until
// the first request is accepted (a token streamed or an answer returned),
// at most `after` requests run at once, fewer with every sample refused
// with the same bad-request error; `after` distinct samples refused with
// identical errors in a row trip it. A different error text starts a new
// streak; other error classes neither count nor break it.
type poisonGuard struct {
	after int         // 0 = off
	open  atomic.Bool // a request was accepted: the guard is off for good

	mu      sync.Mutex
	msg     string
	samples map[string]bool
}

func newPoisonGuard(after int) *poisonGuard {
	g := &poisonGuard{after: after, samples: map[string]bool{}}
	if after <= 0 {
		g.open.Store(true)
	}
	return g
}

// accepted records that the server accepted a request.
func (g *poisonGuard) accepted() {
	if !g.open.Load() {
		g.open.Store(true)
	}
}

// budget is how many requests may be in flight at once, and false when
// the guard no longer limits anything.
func (g *poisonGuard) budget() (int, bool) {
	if g.open.Load() {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.after - len(g.samples), true
}

// badRequest records a sample refused with msg before any acceptance and
// reports whether this completes a streak that trips the guard.
func (g *poisonGuard) badRequest(id, msg string) bool {
	if g.open.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if msg != g.msg {
		g.msg = msg
		clear(g.samples)
	}
	g.samples[id] = true
	return len(g.samples) >= g.after
}

// PoisonError is the reason Run stops when the guard trips.
type PoisonError struct {
	Samples   int      // distinct samples refused in a row
	Message   string   // the server's error, as the client reported it
	Params    []string // request fields the job sets that the message names
	Requeued  int      // samples returned to pending
	RequeueOK bool     // whether returning them worked
}

func (e *PoisonError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dispatch stopped: the server refused %d different samples in a row with the same error before accepting any request, "+
		"so the job's settings are at fault, not the samples: %s", e.Samples, e.Message)
	if len(e.Params) > 0 {
		fmt.Fprintf(&b, "; the error names %s, which the job sends (generation settings)", quoteAll(e.Params))
	} else {
		b.WriteString("; check the model name, generation settings and the server's flags")
	}
	if e.RequeueOK {
		fmt.Fprintf(&b, "; the %d samples it refused are back to pending: fix the job file and run again", e.Requeued)
	} else {
		b.WriteString("; fix the job file, run `regen requeue` with --reason and this error's text, and run again")
	}
	return b.String()
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// mentionedParams returns the request fields the job sets (and the keys of
// object-valued ones, such as chat_template_kwargs) that msg names.
func mentionedParams(msg string, params map[string]json.RawMessage) []string {
	var out []string
	for k, v := range params {
		if strings.Contains(msg, k) {
			out = append(out, k)
		}
		var inner map[string]json.RawMessage
		if json.Unmarshal(v, &inner) != nil {
			continue
		}
		for ik := range inner {
			if strings.Contains(msg, ik) {
				out = append(out, k+"."+ik)
			}
		}
	}
	slices.Sort(out)
	return out
}
