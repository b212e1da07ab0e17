// Package store owns the durable sample state machine: every sample is
// pending, leased, done, rejected or dead, and every transition happens in one
// transaction together with the data it records (a result is stored in the
// same transaction that marks its sample done). Backends implement Store and
// must pass the shared conformance suite in storetest.
//
// The store never decides policy (retries, lanes, escalation); the dispatcher
// does, and tells the store what happened.
package store

import (
	"cmp"
	"context"
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
}

// CompareClaims orders two claimable samples the way Claim hands them out:
// a later turn of a conversation before a sample's first turn, then by
// creation order (seq).
func CompareClaims(turnA int, seqA int64, turnB int, seqB int64) int {
	return cmp.Or(cmp.Compare(min(turnB, 1), min(turnA, 1)), cmp.Compare(seqA, seqB))
}

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

// Store is the durable job state. All methods are safe for concurrent use.
//
// Attempts: Complete, CompleteTurn, Reject, Retry and DeadLetter each spend
// one attempt (so a sample done at the first try has Attempts 1); Release,
// ReleaseOwner, Escalate, Relane and ExpireLeases never spend one. Attempts count
// per turn: CompleteTurn records the turn's attempts with its answer and
// starts the next turn at zero. A limit <= 0 in IngestErrors, LastErrors,
// Events and IngestDuplicates means no limit.
type Store interface {
	// Configs records the job's configuration generations.
	Configs

	// Ingest inserts samples whose ID is not yet present and returns how many
	// were new. Re-ingesting the same samples inserts nothing.
	Ingest(ctx context.Context, samples []NewSample) (inserted int, err error)
	// AddIngestErrors records bad source rows; duplicates (same Origin) are ignored.
	AddIngestErrors(ctx context.Context, errs []IngestError) error
	// IngestErrors returns bad rows in the order first recorded, for short
	// listings. A wrong field mapping makes every source row bad, so callers
	// that need all of them use IngestErrorCount or EachIngestError, whose
	// memory does not grow with the source.
	IngestErrors(ctx context.Context, limit int) ([]IngestError, error)
	// IngestErrorCount returns how many distinct bad rows (by Origin) are recorded.
	IngestErrorCount(ctx context.Context) (int, error)
	// EachIngestError calls fn for every recorded bad row, once each, in
	// the order first recorded (source order: ingest reads files and lines
	// in order). It reads a bounded page at a time and holds
	// nothing while fn runs, so fn may call the store. An error from fn
	// stops the walk and is returned unwrapped.
	EachIngestError(ctx context.Context, fn func(IngestError) error) error

	// Claim leases up to n pending samples of lane whose retry time has come,
	// to owner until now+lease: conversations waiting for a later turn
	// first (oldest first among them), so a turn follows its previous one
	// while that prefix is still cached, then the oldest (first ingested).
	Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]Claimed, error)
	// ExtendLeases pushes the lease of every sample owner holds to now+lease.
	ExtendLeases(ctx context.Context, owner string, lease time.Duration) error
	// Commit runs one lease transition (the methods below are shorthands
	// without a token); a non-zero Token fences it to the lease claimed
	// with that token, so a worker's answer from a lease it lost is refused
	// (ErrNotLeased) even after the same worker claimed the sample again.
	Commit(ctx context.Context, t Transition) error
	// Complete stores r and marks the sample done, in one transaction.
	// r.Turn must be the sample's current turn (ErrWrongTurn otherwise).
	Complete(ctx context.Context, id, owner string, r Result) error
	// Reject stores r with the quality rule that rejected it and the
	// evidence, and marks the sample rejected.
	Reject(ctx context.Context, id, owner string, r Result, rule, evidence string) error
	// Retry returns the sample to pending, spending one attempt, not to be
	// claimed before notBefore; lastErr is kept for status.
	Retry(ctx context.Context, id, owner string, notBefore time.Time, lastErr string) error
	// Release returns samples to pending without spending an attempt
	// (server outage, drain on shutdown). Listed samples owner no longer
	// holds are skipped, not an error.
	Release(ctx context.Context, ids []string, owner string) error
	// ReleaseOwner returns every sample leased by owner to pending without
	// spending attempts (the owner is known dead).
	ReleaseOwner(ctx context.Context, owner string) (int, error)
	// DeadLetter marks the sample dead with reason, spending the attempt.
	DeadLetter(ctx context.Context, id, owner, reason string) error
	// RequeueDead returns dead samples whose last error contains
	// reasonContains ("" = all) to pending with their attempts reset, after
	// the cause (a misconfiguration, a server bug) is fixed. It reports how many.
	RequeueDead(ctx context.Context, reasonContains string) (int, error)
	// Escalate moves a leased sample to pending in another lane without
	// spending an attempt (truncated in a smaller lane).
	Escalate(ctx context.Context, id, owner, lane string) error
	// Relane moves a leased sample to another lane and keeps the lease,
	// spending nothing: its holder already has the answer of the lane it
	// escalates to (a backup that ran beside the truncated request) and
	// stores it next. A sample left there by a crash is redone in that lane.
	Relane(ctx context.Context, id, owner, lane string) error
	// ExpireLeases returns samples whose lease ended before now to pending
	// and reports how many.
	ExpireLeases(ctx context.Context, now time.Time) (int, error)

	// Multi-turn regeneration.

	// CompleteTurn stores r as the answer to the sample's current turn
	// (r.Turn, ErrWrongTurn otherwise) and returns the sample to pending at
	// the next turn, in lane nextLane ("" = the same lane), with no attempts
	// spent, all in one transaction. A turn is stored exactly once.
	CompleteTurn(ctx context.Context, id, owner string, r Result, nextLane string) error

	// Quality rejects.

	// RequeueRejected returns rejected samples (of rule, "" = every rule)
	// to pending at the turn that was rejected, with attempts reset and the
	// rejected answer dropped; earlier turns are kept. It reports how many.
	RequeueRejected(ctx context.Context, rule string) (int, error)
	// RejectCounts returns the rejected samples per partition, lane and rule.
	RejectCounts(ctx context.Context) ([]RejectCount, error)

	// Dataset statistics, kept up to date with every stored answer so that
	// reading them costs the same for 10^3 samples as for 10^7.

	// StatCells returns the per-cell sums, sorted by partition and lane.
	StatCells(ctx context.Context) ([]StatCell, error)
	// EachTokenCount calls fn for every (cell, kind, token count) with a
	// non-zero count, sorted by partition, lane, kind and tokens. fn must
	// not call the store. An error from fn stops the walk and is returned.
	EachTokenCount(ctx context.Context, fn func(TokenCount) error) error
	// ThroughputHistory returns the answers stored per minute, oldest first.
	ThroughputHistory(ctx context.Context) ([]MinuteThroughput, error)
	// ThroughputBuckets returns the answers stored at or after start in
	// buckets of width bucket counted from start (Minute is each bucket's
	// start), oldest first, empty buckets left out. It reads the answers
	// themselves (a covering index), so it is for short spans: a job's
	// first hour, where minutes are too coarse.
	ThroughputBuckets(ctx context.Context, start time.Time, bucket time.Duration) ([]MinuteThroughput, error)
	// IngestDuplicates counts the source rows skipped at ingest because
	// their id was already taken by another row (same origin = the same
	// row read again, which is no duplicate), with up to limit examples.
	IngestDuplicates(ctx context.Context, limit int) (Duplicates, error)

	// Counts returns sample counts per partition, lane and state.
	Counts(ctx context.Context) ([]Count, error)
	// ThroughputSince sums finished work since t: samples done or rejected,
	// and the tokens of every answer stored (earlier turns included).
	ThroughputSince(ctx context.Context, t time.Time) (Throughput, error)
	// Finished calls fn for every done, rejected or dead sample in ID order.
	Finished(ctx context.Context, fn func(Row) error) error
	// LastErrors returns the samples with the most recent retry/dead-letter
	// reasons, newest first; rows carry no Result and State is the current one.
	LastErrors(ctx context.Context, limit int) ([]Row, error)

	// PutHeartbeat replaces hb.Owner's heartbeat.
	PutHeartbeat(ctx context.Context, hb Heartbeat) error
	// LastHeartbeat returns the newest heartbeat (by Time) of any worker,
	// ok=false if none was written.
	LastHeartbeat(ctx context.Context) (hb Heartbeat, ok bool, err error)
	// AddEvent appends e; a zero Time is stamped with the store's clock.
	AddEvent(ctx context.Context, e Event) error
	// Events returns the newest events first.
	Events(ctx context.Context, limit int) ([]Event, error)

	// Many workers: every worker's heartbeat, and named locks between them.

	// Heartbeats returns the latest heartbeat of every worker that ever
	// wrote one, newest first.
	Heartbeats(ctx context.Context) ([]Heartbeat, error)
	// TryLock takes the named lock if no one holds it, without waiting, and
	// returns the function that releases it; ok is false while another
	// holder (in this process or another one sharing the store) has it. A
	// holder that dies releases its locks. Locks are not reentrant.
	TryLock(ctx context.Context, name string) (unlock func() error, ok bool, err error)

	// Ingest manifest: which source files are already fully ingested.

	// SourceFile returns the manifest entry of path in partition.
	SourceFile(ctx context.Context, partition, path string) (f SourceFile, ok bool, err error)
	// PutSourceFile records f, replacing the entry of its partition and path.
	PutSourceFile(ctx context.Context, f SourceFile) error

	// Reconcile after an ambiguous write: a claim whose reply was lost (the
	// connection dropped mid-statement) may have leased samples the caller
	// never received.

	// ReleaseOwnerExcept returns every sample leased by owner except those
	// in keep to pending without spending attempts, and reports how many.
	ReleaseOwnerExcept(ctx context.Context, owner string, keep []string) (int, error)

	// Dashboard history and sample browser (regen watch, the web dashboard).
	// PutMinutes inserts or replaces rows keyed by (Time, Worker, Endpoint).
	PutMinutes(ctx context.Context, ms []Minute) error
	// Minutes returns the rows whose Time is at or after since, oldest
	// first (then by Worker and Endpoint).
	Minutes(ctx context.Context, since time.Time) ([]Minute, error)
	// Sample returns one sample in any state, with its body, its last
	// answer (Result) and the answers to its earlier turns (Prior, also
	// while it is in progress); Reason and Rule are the reject's evidence
	// and rule, else Reason is the last error; ok=false if unknown.
	Sample(ctx context.Context, id string) (row Row, ok bool, err error)
	// Samples lists the samples matching q in ID order, without Body,
	// Result.Response and Prior (a listing must stay small whatever the
	// prompts are).
	Samples(ctx context.Context, q SampleQuery) ([]Row, error)

	// Info describes the backend.
	Info() Info
	Close() error
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
