package dispatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/regen-dev/regen/internal/llm"
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

	mu       sync.Mutex
	msg      string
	samples  map[string]bool
	endpoint string // where the last refusal came from, and its status
	status   int
	fault    bool // the last refusal was not the API at all (llm.Error.EndpointFault)
	// refusers are the endpoints that refused a request itself (isRefusal)
	// while the guard was armed.
	refusers map[string]bool
}

func newPoisonGuard(after int) *poisonGuard {
	g := &poisonGuard{after: after, samples: map[string]bool{}, refusers: map[string]bool{}}
	if after <= 0 {
		g.open.Store(true)
	}
	return g
}

// armed reports whether no request was accepted yet (and the guard is on).
func (g *poisonGuard) armed() bool { return !g.open.Load() }

// refusedLocked reports whether sample id is in the current streak: it was
// refused and went back to pending unspent, so claiming it again would
// only count it twice.
func (g *poisonGuard) refused(id string) bool {
	if g.open.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.samples[id]
}

// refusedBy records that the endpoint at url refused a request itself and
// reports whether every endpoint of urls has: one misconfigured server
// among working ones is that server's outage, not the job's.
func (g *poisonGuard) refusedBy(url string, urls []string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refusers[url] = true
	for _, u := range urls {
		if !g.refusers[u] {
			return false
		}
	}
	return true
}

// streak is the number of distinct samples in the current streak.
func (g *poisonGuard) streak() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.samples)
}

// exhausted stops d when every sample left to try was refused in the
// current streak: a job smaller than the guard's count would otherwise
// claim and give back the same samples for ever.
func (g *poisonGuard) exhausted(d *Dispatcher) {
	if pe := g.streakError(d.cfg.Params); pe != nil {
		d.fatal(pe)
	}
}

// streakError describes the current streak as the reason to stop, its
// samples all back to pending; nil when there is none or the guard is off.
func (g *poisonGuard) streakError(params map[string]json.RawMessage) *PoisonError {
	g.mu.Lock()
	msg, n, url, status, fault := g.msg, len(g.samples), g.endpoint, g.status, g.fault
	g.mu.Unlock()
	if n == 0 || g.open.Load() {
		return nil
	}
	return &PoisonError{Samples: n, Message: msg, Params: mentionedParams(msg, params), Requeued: n, RequeueOK: true,
		Status: status, Endpoint: url, EndpointFault: fault}
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

// badRequest records a sample refused with msg (a bad request, or a
// refusal of the request itself: isRefusal) before any acceptance and
// reports whether this completes a streak that trips the guard.
func (g *poisonGuard) badRequest(id string, reqErr error, url string) bool {
	if g.open.Load() {
		return false
	}
	msg := reqErr.Error()
	var le *llm.Error
	g.mu.Lock()
	defer g.mu.Unlock()
	g.endpoint, g.status, g.fault = url, statusOf(reqErr), errors.As(reqErr, &le) && le.EndpointFault
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
	Endpoint  string   // the endpoint that refused the last one
	Status    int      // its HTTP status, 0 when none
	Params    []string // request fields the job sets that the message names
	Requeued  int      // samples returned to pending
	RequeueOK bool     // whether returning them worked
	// EndpointFault: the answers were not the API at all (llm.Error's
	// EndpointFault: a web page, a whole JSON body, no headers).
	EndpointFault bool
}

func (e *PoisonError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dispatch stopped: the server refused %d different samples in a row with the same error before accepting any request, "+
		"so the job's settings are at fault, not the samples: %s", e.Samples, e.shownMessage())
	switch {
	case e.EndpointFault:
		b.WriteString("; the endpoint does not answer as an OpenAI-compatible chat server: check its url (host, port, path) in the job file")
	case len(e.Params) > 0:
		fmt.Fprintf(&b, "; the error names %s, which the job sends (generation settings)", quoteAll(e.Params))
	case e.Status == 401 || e.Status == 403:
		b.WriteString("; the server refuses the job's credentials: check the endpoint's api_key_env and the key it names")
	case e.Status == 404:
		b.WriteString("; the server does not know the model or the path: check model: and the endpoint's url")
	case e.Status >= 500:
		b.WriteString("; the server fails every request the same way: check its log")
	default:
		b.WriteString("; check the model name, generation settings and the server's flags")
	}
	if e.RequeueOK {
		fmt.Fprintf(&b, "; the %d samples it refused are back to pending: fix the job file and run again", e.Requeued)
	} else {
		b.WriteString("; fix the job file, run `regen requeue` with --reason and this error's text, and run again")
	}
	return b.String()
}

// shownMessage is Message without the client's class word when the server
// answered with a status: "HTTP 404: ..." rather than "server-down (HTTP
// 404): ...", which would blame an outage.
func (e *PoisonError) shownMessage() string {
	if e.Status == 0 {
		return e.Message
	}
	if _, rest, ok := strings.Cut(e.Message, " (HTTP "); ok {
		return "HTTP " + strings.Replace(rest, ")", "", 1)
	}
	return e.Message
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
