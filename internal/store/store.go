package store

import (
	"cmp"
	"errors"
	"time"
)

// State is where a sample is in its life.
type State string

const (
	Pending  State = "pending"
	Leased   State = "leased"
	Done     State = "done"
	Rejected State = "rejected"
	Dead     State = "dead"
)

// ErrNotLeased is returned when a transition needs a lease the caller no
// longer holds (it expired and the sample was claimed again, or it finished).
var ErrNotLeased = errors.New("sample not leased by this owner")

// ErrNoStore is returned by backends asked to open, without creating, a job
// store that does not exist (the job was never run).
var ErrNoStore = errors.New("no store for this job yet")

// ErrWrongTurn is returned when a result names a turn other than the one
// the sample is at: a turn is recorded once, in order.
var ErrWrongTurn = errors.New("result is not for the sample's current turn")

// NewSample is one prompt to ingest. ID is stable and unique within the job.
type NewSample struct {
	ID           string
	Partition    string
	Lane         string
	Body         []byte // canonical request content: {"messages":[...],"tools":[...]}
	PromptTokens int    // estimate, for lane assignment and planning
	Origin       string // file:line (or file:row N for Parquet)
}

// IngestError records a source row that could not become a sample.
// It is keyed by Origin, so re-ingesting the same bad file adds nothing.
type IngestError struct {
	Partition string
	Origin    string // file:line
	Field     string // the offending field, "" when the row as a whole is bad
	Reason    string
}

// Claimed is a leased sample handed to a worker.
type Claimed struct {
	ID           string
	Partition    string
	Lane         string
	Body         []byte
	PromptTokens int
	Attempts     int // attempts spent so far on this turn (server outages never spend one)
	LeaseUntil   time.Time
	// Token is the lease's fencing token, unique per claim of a sample on
	// a shared store (0 where the backend keeps none): a transition
	// carrying it (Commit) takes only under this very lease.
	Token int64
	// Turn is the turn to generate (0 = the first answer); Prior holds the
	// stored answers to turns 0..Turn-1, in order.
	Turn  int
	Prior []Result
	// Kept says Body and Prior were left out: the caller named this turn
	// of the sample in ClaimKept and holds them.
	Kept bool
	// Seq is the sample's place in the order claims hand samples out in
	// (CompareClaims): a caller naming kept histories names those the
	// next claims will take.
	Seq int64
}

// Kept names a conversation whose history a ClaimKept caller holds: the
// sample's body and the stored answers to turns 0..Turn-1, the last of
// them stored under the lease Token (Claimed.Token; 0 where the backend
// keeps none).
type Kept struct {
	ID    string
	Turn  int
	Token int64
}

// CompareClaims orders two claimable samples the way Claim hands them out:
// a later turn of a conversation before a sample's first turn, then by
// creation order (seq).
func CompareClaims(turnA int, seqA int64, turnB int, seqB int64) int {
	return cmp.Or(cmp.Compare(min(turnB, 1), min(turnA, 1)), cmp.Compare(seqA, seqB))
}

// ClaimOrder is CompareClaims for two claimed samples.
func ClaimOrder(a, b Claimed) int { return CompareClaims(a.Turn, a.Seq, b.Turn, b.Seq) }

// Result is what a finished attempt stored.
type Result struct {
	Response         []byte // the stored answer (package reply: content, reasoning, tool calls, usage, timings, provenance)
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
	Endpoint         string
	Duration         time.Duration
	TTFT             time.Duration
	// Turn is the turn this result answers; a sample's turns are stored in
	// order, each exactly once.
	Turn            int
	ReasoningTokens int
	// EndReason says why a conversation ended before its planned last turn
	// ("" when it did not): the model's answer could not be followed by the
	// dataset's next turn.
	EndReason string
	// Lane and Attempts are where the answer was generated and the attempts
	// it took; set only on the answers the store returns in Claimed.Prior
	// and Row.Prior (a Row carries its own Lane and Attempts).
	Lane     string
	Attempts int
	// Generation is the configuration generation the answer was generated
	// with (see Configs); 0 when the writer named none.
	Generation int
}

// Row is one finished sample, as export and status read it.
type Row struct {
	ID         string
	Partition  string
	Lane       string
	State      State // Done, Rejected or Dead
	Body       []byte
	Attempts   int
	Result     Result // the last turn's answer; zero for Dead
	Reason     string // reject evidence or dead-letter reason
	Rule       string // the quality rule that rejected it ("" unless Rejected)
	Prior      []Result
	FinishedAt time.Time
	Origin     string // file:line the sample came from (filled by Sample, Samples and Finished)
}

// RejectCount is the number of rejected samples of one cell per rule.
type RejectCount struct {
	Partition string
	Lane      string
	Rule      string
	N         int
}

// StatCell sums the stored answers (one per finished turn: done, rejected
// or continued to a next turn) of one (partition, lane) cell.
type StatCell struct {
	Partition        string
	Lane             string
	Requests         int
	Truncated        int // finish_reason "length"
	Rejected         int // rejected by a quality rule
	WithReasoning    int // reasoning tokens > 0
	Ended            int // conversations ended before their last planned turn
	PromptTokens     int64
	CompletionTokens int64
	ReasoningTokens  int64
}

// Token count kinds.
const (
	PromptKind     = "prompt"
	CompletionKind = "completion"
)

// TokenCount is how many stored answers of a cell had exactly Tokens
// prompt (or completion) tokens.
type TokenCount struct {
	Partition string
	Lane      string
	Kind      string // PromptKind or CompletionKind
	Tokens    int
	N         int
}

// MinuteThroughput is the answers stored in one minute of wall time.
type MinuteThroughput struct {
	Minute           time.Time
	Requests         int
	PromptTokens     int64
	CompletionTokens int64
}

// Duplicate is a source row whose id was already ingested from another
// row: it did not become a sample.
type Duplicate struct {
	ID          string
	Partition   string
	Origin      string // the row that was skipped
	FirstOrigin string // the row the sample was made from
	SameContent bool   // the two rows mapped to the same body
}

// Duplicates summarises the duplicate ids found at ingest.
type Duplicates struct {
	Total       int
	SameContent int
	Examples    []Duplicate // the first ones by origin, up to the limit asked
}

// Count is the number of samples in one (partition, lane, state) cell.
type Count struct {
	Partition string
	Lane      string
	State     State
	N         int
}

// Event is a state change or notable occurrence recorded for `regen status`.
type Event struct {
	Time     time.Time
	Kind     string // e.g. "endpoint_state", "job_state", "restart", "alert_failed"
	Subject  string // e.g. an endpoint URL or "job"
	State    string // the new state, when Kind is a state change
	Evidence string // human-readable evidence (exit code, log lines, seconds since last token)
	Worker   string // the owner id of the worker that recorded it ("" = not a worker)
}

// Heartbeat is one worker's proof of life, rewritten every few seconds. A
// store keeps the latest heartbeat of every worker (by Owner).
type Heartbeat struct {
	Owner    string // the runner's lease owner id
	PID      int
	Host     string
	Time     time.Time
	Started  time.Time
	Counters []byte // JSON snapshot the runner chooses (tokens, states, endpoints)
}

// SourceFile is the ingest manifest entry of one source file in one
// partition: what the file looked like when it was read, and whether every
// row of it reached the store. A re-run skips a file whose entry is
// Complete and whose size, modification time and fingerprint still match.
type SourceFile struct {
	Partition   string
	Path        string
	Size        int64
	ModTime     time.Time
	Fingerprint string // content fingerprint (and the mapping it was read with)
	Rows        int    // good rows handed to Ingest
	Bad         int    // rows recorded as ingest errors
	Complete    bool
}

// Info describes a store for messages and for the runner's rules.
type Info struct {
	Backend  string // "sqlite" or "postgres"
	Location string // file path, or the DSN with any password removed, and the job's schema
	// Shared stores let several workers run one job at once; the runner
	// otherwise refuses to start beside a live one.
	Shared bool
}

// Throughput is the completion work finished in a window.
type Throughput struct {
	Samples          int // samples finished (done or rejected)
	CompletionTokens int64
	PromptTokens     int64
	// First and Last are the finish times of the earliest and the latest
	// result counted (zero when none), so a finished job's average rate is
	// its work over Last-First.
	First, Last time.Time
}

// Minute is one minute of one worker's activity, written by the runner so
// the dashboard shows the past hours after a reload or a restart. Endpoint
// "" holds the worker's totals; counters are what happened within the
// minute, gauges the last reading in it.
type Minute struct {
	Time     time.Time // start of the minute
	Worker   string    // the runner's lease owner id
	Endpoint string
	Samples  int   // samples finished (done, rejected or dead)
	Tokens   int64 // tokens streamed
	Requests int64 // requests finished, whatever their outcome
	Errors   int64 // requests that failed
	InFlight int   // requests on the wire at the last reading
	// Server gauges from the endpoint's metrics; -1 when not scraped.
	KVUsage float64 // KV cache usage, 0..1
	Queued  float64 // requests waiting in the server's queue
	Running float64 // requests the server is running
	Limit   int     // concurrency limit regen applied to the endpoint (0 = none known)
}

// SampleQuery selects samples for Samples. Empty fields match everything;
// After is a keyset cursor (the last ID of the previous page).
type SampleQuery struct {
	Partition string
	State     State
	After     string
	Limit     int // at most this many rows; <= 0 means 100
}
