package dispatch

import (
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
)

// Snapshot is a copy of the dispatcher's live state for progress views,
// heartbeats and the supervisor's hang detection.
type Snapshot struct {
	StartedAt time.Time       `json:"started_at"`
	Endpoints []EndpointStats `json:"endpoints"`
	Lanes     []LaneStats     `json:"lanes"`
	Counters  Counters        `json:"counters"`
	Store     StoreStats      `json:"store"`
}

// StoreStats says whether the store accepts writes. While Down, results
// wait in memory and every write is retried with backoff.
type StoreStats struct {
	Down       bool          `json:"down"`
	Since      time.Time     `json:"since,omitzero"` // start of the current outage
	LastError  string        `json:"last_error,omitempty"`
	Failures   int64         `json:"failures"`    // failed store calls since Run started
	Outages    int64         `json:"outages"`     // outages since Run started
	LastOutage time.Duration `json:"last_outage"` // length of the last outage that ended
}

// EndpointStats is one endpoint's state.
type EndpointStats struct {
	URL         string `json:"url"`
	InFlight    int    `json:"in_flight"`
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason,omitempty"`
	// Breaker is "closed", "open" or "half-open"; BreakerOpenUntil is zero when closed.
	Breaker          string    `json:"breaker"`
	BreakerOpenUntil time.Time `json:"breaker_open_until,omitzero"`
	// LastTokenAt is the time of the last streamed chunk from this endpoint
	// and BusySince when its in-flight count last rose from zero: a hang is
	// InFlight > 0 with no token since max(LastTokenAt, BusySince) for the
	// deadline.
	LastTokenAt time.Time `json:"last_token_at,omitzero"`
	BusySince   time.Time `json:"busy_since,omitzero"`
	// TokensTotal sums the counts passed to onDelta (llm.Client passes 1 per
	// chunk carrying content, reasoning or a tool-call delta).
	TokensTotal int64 `json:"tokens_total"`
	// CompletionTokens sums the usage of every answer received (chunks
	// undercount it when a server puts several tokens in one).
	CompletionTokens int64 `json:"completion_tokens"`
	// StreamedTokens counts tokens as they stream (chunks at the
	// endpoint's learnt tokens per chunk), each answer topped up to its
	// usage when it completes; a failed request keeps what it streamed
	// (the server decoded it). The views' rates and charts use it.
	StreamedTokens int64 `json:"streamed_tokens"`
	Requests       int64 `json:"requests"`
	// Errors counts failed requests by llm.Class name ("retryable",
	// "server-down", "bad-request", "malformed"); cancellations by Pause or
	// drain are not errors.
	Errors map[string]int64 `json:"errors,omitempty"`
	// LastServerDown is the last server-down error from this endpoint.
	LastServerDown string `json:"last_server_down,omitempty"`
	// BrokenSince: samples in a row failed here with the same server error
	// while nothing succeeded (burn.go), BrokenSamples of them; the
	// endpoint is paused behind its breaker and probed with one request at
	// a time. Zero when it is not broken.
	BrokenSince   time.Time `json:"broken_since,omitzero"`
	BrokenSamples int       `json:"broken_samples,omitempty"`
	// HeldUntil: the server asked for less load (429, or 503 with
	// Retry-After) and gets no new request before this; zero when not held.
	HeldUntil time.Time `json:"held_until,omitzero"`
	// HoldSince and HoldReason are the last hold's start and the answer
	// that began it, and FixedCap the cap it put on the fixed lanes'
	// requests here (it grows back by one per answer; 0 = none): set while
	// held or capped.
	HoldSince  time.Time `json:"hold_since,omitzero"`
	HoldReason string    `json:"hold_reason,omitempty"`
	FixedCap   int       `json:"fixed_cap,omitempty"`
	// Replays counts requests its client sent again on a fresh connection
	// because the server closed the kept-alive one first (llm.Client's
	// Replays; a keep-alive race, never an error).
	Replays int64 `json:"replays,omitempty"`

	// KVTokens is the server's KV pool in tokens (0 = not known yet) and
	// KVTokensSource where it came from: CapacityServer or CapacityJob.
	KVTokens       float64 `json:"kv_tokens,omitempty"`
	KVTokensSource string  `json:"kv_tokens_source,omitempty"`
	// CommittedTokens is the KV the requests in flight are expected to
	// fill (each: prompt estimate + its lane's mean completion), what
	// token-aware balancing compares with KVTokens.
	CommittedTokens float64 `json:"committed_tokens"`
	// Load is the server's pressure at its last probe; nil before one.
	Load *ServerLoad `json:"load,omitempty"`
	// Lanes holds each lane's share of this endpoint and, for an auto
	// lane, the endpoint's own limit and its last decision.
	Lanes []EndpointLane `json:"lanes"`
	// AutoLimit is how many requests the auto lanes may have here at once:
	// their limits summed, held to the ceiling a crash under pressure set
	// for them together (0 without auto lanes).
	AutoLimit int `json:"auto_limit"`
}

// ServerLoad is one probe's view of a server's pressure. A field the engine
// does not report is -1.
type ServerLoad struct {
	At               time.Time `json:"at"`
	Running          float64   `json:"running"`
	Queued           float64   `json:"queued"`
	KVUsage          float64   `json:"kv_usage"` // 0..1
	RetractionsTotal float64   `json:"retractions_total"`
}

// EndpointLane is one lane on one endpoint.
type EndpointLane struct {
	Lane     string `json:"lane"`
	InFlight int    `json:"in_flight"`
	// Limit is the endpoint's own limit for an auto lane, the lane's limit
	// (shared by every endpoint) for a fixed one. Auto lanes only: the
	// ceiling crashes set (0 = none), the decision that last judged the
	// limit and the last one that moved it.
	Auto     bool            `json:"auto"`
	Limit    int             `json:"limit"`
	Ceiling  int             `json:"ceiling,omitempty"`
	Decision *limit.Decision `json:"decision,omitempty"`
	Moved    *limit.Decision `json:"moved,omitempty"`
}

// LaneStats is one lane's concurrency and request timing. For an auto lane
// Limit is the sum of its per-endpoint limits over endpoints taking requests.
type LaneStats struct {
	Name     string `json:"name"`
	InFlight int    `json:"in_flight"`
	Limit    int    `json:"limit"`
	Auto     bool   `json:"auto"`
	// MeanDuration is the mean duration of the lane's last answered
	// requests (0 before the first). Tail is the expected time until every
	// request it has in flight now is answered (0 with none in flight).
	MeanDuration time.Duration `json:"mean_duration_ns"`
	Tail         time.Duration `json:"tail_ns"`
	// EscalateTo is the lane a truncated answer moves to ("" = none);
	// Escalated of the lane's Answered answers (since Run started) did.
	EscalateTo string `json:"escalate_to"`
	Answered   int64  `json:"answered"`
	Escalated  int64  `json:"escalated"`
	// Kept is the lane's claimed samples waiting here for a slot on the
	// endpoint that caches their prefix (backlog.go): leased in the store,
	// not yet sent.
	Kept int `json:"kept"`
}

// Counters count sample outcomes since Run started, each after the store
// recorded it.
type Counters struct {
	Done         int64 `json:"done"`          // completed, truncated ones included
	Truncated    int64 `json:"truncated"`     // completed with finish_reason=length and no bigger lane
	Turns        int64 `json:"turns"`         // answers stored with a turn after them (the sample went on)
	Ended        int64 `json:"ended"`         // completed before the plan's last turn (the dataset could not follow the answer)
	Rejected     int64 `json:"rejected"`      // refused by a quality rule
	Escalated    int64 `json:"escalated"`     // moved to a bigger lane after truncation
	Retried      int64 `json:"retried"`       // returned to pending with an attempt spent
	DeadLettered int64 `json:"dead_lettered"` // bad requests and exhausted retries
	Released     int64 `json:"released"`      // returned to pending without spending an attempt
	// LeaseLost counts outcomes the store refused because the lease was
	// gone (this worker was paused or cut off past dead_after and another
	// took the sample): each such answer was dropped; the sample's new
	// holder stores its own.
	LeaseLost  int64 `json:"lease_lost"`
	ServerDown int64 `json:"server_down"` // requests that failed with a server-down error
	// Moved counts requests cancelled while queued at one server, before a
	// token, to go to one with room once the store had no more of their lane.
	Moved int64 `json:"moved"`
	// Shed counts requests cancelled to relieve KV pressure on a server
	// that crashed under it, released without spending an attempt.
	Shed int64 `json:"shed"`
	// Backups counts backups started in an escalation lane for requests
	// near their max_tokens at the end of the work (hedge.go); BackupsUsed
	// those whose answer was stored because the first request was
	// truncated. The others were cancelled.
	Backups     int64 `json:"backups"`
	BackupsUsed int64 `json:"backups_used"`
	// Burnt counts server errors judged the endpoint's, not the sample's
	// (burn.go): each sample went back without spending an attempt.
	Burnt int64 `json:"burnt,omitempty"`
}
