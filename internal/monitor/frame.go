package monitor

import "time"

// Frame is one moment of a running job, as the runner publishes it to
// the views that subscribe (the terminal progress view).
type Frame struct {
	Time      time.Time
	Job       string
	State     State
	Evidence  []string
	Cells     []CellCounts // per partition and lane
	Tokens    int64        // tokens streamed so far (dispatch StreamedTokens summed)
	InFlight  int
	Endpoints []EndpointStatus
	Lanes     []LaneTiming
	// Notes are lines to print once, above this frame (ingest done,
	// draining, a model warning).
	Notes []string
}

// LaneTiming is how long a lane's requests take, for the ETA of the work
// already in flight: throughput alone says nothing about the last requests
// of a job, which run alone and are often its longest.
type LaneTiming struct {
	Name         string
	MeanDuration time.Duration // of answered requests; 0 before the first
	Tail         time.Duration // expected time until the requests in flight now are answered
	// EscalateTo is the lane a truncated answer moves to ("" = none), and
	// Escalated of Answered answers of this lane did so far: the share of
	// the last requests that still need a whole request there.
	EscalateTo          string
	Answered, Escalated int64
	// InFlight is the lane's requests on the wire. Fewer than the samples
	// the store has leased in the lane means some are being answered in the
	// escalation lane (a truncated last answer is sent there at once, under
	// its lease, before the store moves it).
	InFlight int
	// Kept is the lane's samples claimed ahead and held for a slot on the
	// endpoint that caches their prefix: leased too, but not answered
	// anywhere yet.
	Kept int
}
