package monitor

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/state"
)

// State is a job's or an endpoint's condition: the one vocabulary
// (internal/state) the supervisor and the fleet speak too.
type State = state.State

// The states, as monitor's names (see internal/state).
const (
	Starting   = state.Starting
	Ready      = state.Ready
	Degraded   = state.Degraded
	Running    = state.Running
	Draining   = state.Draining
	Stalled    = state.Stalled
	Down       = state.Down
	Restarting = state.Restarting
	Failed     = state.Failed
	Done       = state.Done
	Dead       = state.Dead
	Stopped    = state.Stopped
)

// ExitCode is what `regen status` exits with: 0 when work is progressing or
// finished, 1 when it is held up but someone is on it, 2 when nobody is.
func ExitCode(s State) int {
	switch s {
	case Running, Draining, Done, Ready, Starting:
		return 0
	case Stalled, Down, Restarting, Degraded:
		return 1
	default:
		return 2
	}
}

// Alarming reports whether entering or leaving s fires an alert.
func Alarming(s State) bool {
	switch s {
	case Stalled, Down, Failed, Dead:
		return true
	}
	return false
}

// EndpointStatus is one endpoint's condition as the runner saw it.
type EndpointStatus struct {
	URL         string    `json:"url"`
	State       State     `json:"state"`
	Since       time.Time `json:"since"` // when it entered State
	Cause       string    `json:"cause"`
	Evidence    []string  `json:"evidence"`
	Restarts    int       `json:"restarts"`
	InFlight    int       `json:"in_flight"`
	LastTokenAt time.Time `json:"last_token_at"`
	Tokens      int64     `json:"tokens"`

	// Limit is how many requests regen lets the endpoint have at once now:
	// its own adaptive limit for each auto lane plus the limits of the
	// fixed lanes, which all endpoints share (0 before dispatch started).
	Limit int `json:"limit"`
	// LimitReason says why the limit last moved: an auto lane's decision
	// with its evidence, or that the job file fixes it.
	LimitReason string `json:"limit_reason"`
	// Lanes is the limit of each lane on this endpoint.
	Lanes []LaneLimit `json:"lanes"`
	// KVTokens is the server's KV pool in tokens (0 = not known yet) and
	// KVTokensSource where it came from: "server" (its metrics or server
	// info) or "job" (kv_tokens in the job file).
	KVTokens       int64  `json:"kv_tokens"`
	KVTokensSource string `json:"kv_tokens_source"`
	// Load is the server's pressure at its last probe; nil before one.
	Load *Load `json:"load"`
	// Hold is set while the server has asked for less load (a 429, or a
	// 503 with Retry-After) and regen holds new requests, or still caps
	// the fixed lanes' requests after it; nil otherwise.
	Hold *Hold `json:"hold"`
	// Replays counts requests sent again on a fresh connection because the
	// server closed the kept-alive one before answering (llama-server does
	// after every streamed answer); they cost no attempt and are no error.
	Replays int64 `json:"replays"`
}

// Hold is backpressure from a server: no new request before Until (zero
// once the hold is over), the fixed lanes' requests capped at FixedCap
// (0 = no cap; it grows back by one per answer).
type Hold struct {
	Since    time.Time `json:"since"`
	Until    time.Time `json:"until"`
	Reason   string    `json:"reason"` // the answer that began it, with its Retry-After
	FixedCap int       `json:"fixed_cap"`
}

// MarshalJSON writes a hold with null for a time not known (until, once
// the hold is over and only the cap remains).
func (h Hold) MarshalJSON() ([]byte, error) {
	type plain Hold
	return json.Marshal(struct {
		Since *time.Time `json:"since"`
		Until *time.Time `json:"until"`
		plain
	}{nullTime(h.Since), nullTime(h.Until), plain(h)})
}

// Text is the hold for people: "held since 01:02:03 until 01:02:05: 429
// Too Many Requests (Retry-After 2s); fixed lanes capped at 1".
func (h Hold) Text() string {
	var parts []string
	if !h.Until.IsZero() {
		parts = append(parts, fmt.Sprintf("held by the server since %s until %s: %s", h.Since.UTC().Format("15:04:05"), h.Until.UTC().Format("15:04:05"), h.Reason))
	} else {
		parts = append(parts, fmt.Sprintf("after the server's backpressure at %s (%s)", h.Since.UTC().Format("15:04:05"), h.Reason))
	}
	if h.FixedCap > 0 {
		parts = append(parts, fmt.Sprintf("fixed lanes capped at %d requests, one more per answer", h.FixedCap))
	}
	return strings.Join(parts, "; ")
}

// LaneLimit is one lane's limit on one endpoint.
type LaneLimit struct {
	Lane     string `json:"lane"`
	InFlight int    `json:"in_flight"`
	Limit    int    `json:"limit"`
	// Auto: the limit is the endpoint's own and adapts; otherwise it is the
	// lane's fixed limit, shared by all endpoints.
	Auto bool `json:"auto"`
	// Ceiling is the cap crashes under pressure set, 0 for none.
	Ceiling int `json:"ceiling"`
	// Reason is the decision that last moved the limit, with its evidence.
	Reason string `json:"reason"`
}

// Load is what one probe read of a server's pressure; a figure the engine
// does not report is nil.
type Load struct {
	At time.Time `json:"at"`
	// Every is the probe interval the reading was taken at (0: unknown);
	// Age is how old the reading was when the report was made (set by
	// Assess). A reading older than its interval is stale (Stale).
	Every            time.Duration `json:"probe_every_ns"`
	Age              time.Duration `json:"age_ns"`
	Running          *float64      `json:"running"`
	Queued           *float64      `json:"queued"`
	KVUsage          *float64      `json:"kv_usage"` // 0..1
	RetractionsTotal *float64      `json:"retractions_total"`
}

// defaultProbeEvery stands in for the interval of a reading that does
// not carry one (written by an older runner): the job default.
const defaultProbeEvery = 5 * time.Second

// Stale says how old the reading is when that is more than one probe
// interval: a view must then say so beside the figures, which describe the
// server as it was, not as it is.
func (l *Load) Stale() (time.Duration, bool) {
	if l == nil || l.At.IsZero() {
		return 0, false
	}
	every := l.Every
	if every <= 0 {
		every = defaultProbeEvery
	}
	return l.Age, l.Age > every
}

// StaleNote is Stale as the views print it: "" for a fresh reading.
func (l *Load) StaleNote() string {
	if age, stale := l.Stale(); stale {
		return fmt.Sprintf("(read %s ago)", age.Round(time.Second))
	}
	return ""
}

// Live is what the runner knows at one moment; Evaluate turns it into a state.
type Live struct {
	Now         time.Time
	StartedAt   time.Time
	Endpoints   []EndpointStatus
	Remaining   int       // samples pending or leased
	InFlight    int       // requests on the wire
	LastTokenAt time.Time // last streamed chunk from any endpoint
	StallAfter  time.Duration
	// StoreDown is the store's error while it does not answer (""
	// otherwise), since StoreDownSince; results wait in memory meanwhile.
	StoreDown      string
	StoreDownSince time.Time
}

// Evaluate decides the runner's job state from live evidence. Order matters:
// a dead or restarting server explains a lack of tokens, so it is reported
// before STALLED.
func Evaluate(l Live) (State, []string) {
	if l.StoreDown != "" {
		// Nothing can be recorded: whatever the endpoints do, the job is
		// held up by its store.
		return Down, []string{fmt.Sprintf("store down for %s: %s; %d requests in flight, their results kept in memory until it is back",
			l.Now.Sub(l.StoreDownSince).Round(time.Second), l.StoreDown, l.InFlight)}
	}
	if l.Remaining == 0 && l.InFlight == 0 {
		return Done, nil
	}
	var ready, down, restarting, failed []string
	for _, e := range l.Endpoints {
		label := fmt.Sprintf("%s %s", e.URL, e.State)
		if e.Cause != "" {
			label += " (" + e.Cause + ")"
		}
		switch e.State {
		case Ready, Degraded, Running:
			ready = append(ready, label)
		case Down, Stalled:
			down = append(down, label)
		case Restarting, Starting:
			restarting = append(restarting, label)
		case Failed:
			failed = append(failed, label)
		}
	}
	if len(l.Endpoints) > 0 && len(ready) == 0 {
		starting := 0
		for _, e := range l.Endpoints {
			if e.State == Starting && e.Restarts == 0 {
				starting++
			}
		}
		switch {
		case starting == len(l.Endpoints):
			return Starting, restarting
		case len(restarting) > 0:
			return Restarting, append(restarting, append(down, failed...)...)
		case len(down) > 0:
			return Down, append(down, failed...)
		default:
			return Failed, failed
		}
	}
	last := l.LastTokenAt
	if last.IsZero() {
		last = l.StartedAt
	}
	if idle := l.Now.Sub(last); l.StallAfter > 0 && idle > l.StallAfter {
		ev := []string{fmt.Sprintf("no token received for %s with %d samples remaining and %d in flight",
			idle.Round(time.Second), l.Remaining, l.InFlight)}
		if len(down)+len(failed) > 0 {
			ev = append(ev, strings.Join(append(down, failed...), "; "))
		}
		return Stalled, ev
	}
	return Running, nil
}
