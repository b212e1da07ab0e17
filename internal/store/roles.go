package store

import (
	"context"
	"time"
)

// The store is offered in roles, one per kind of consumer, the way
// database/sql/driver and Prometheus's storage.Appendable/Queryable split
// theirs: a consumer takes the narrowest role (or union of roles) it
// uses, and a fake implements only what its consumer needs. Every backend
// implements Store, their union, and passes storetest.
//
// Attempts: Complete, CompleteTurn, Reject, Retry and DeadLetter (and the
// Commits they stand for) each spend one attempt (so a sample done at the
// first try has Attempts 1); Release, ReleaseOwner, Escalate, Relane,
// ExpireLeases and a Commit of OpDefer (pending after a time, a server
// error that was not the sample's) never spend one. Attempts count per turn: CompleteTurn
// records the turn's attempts with its answer and starts the next turn at
// zero. A limit <= 0 in IngestErrors, LastErrors, Events and
// IngestDuplicates means no limit. All methods are safe for concurrent use.

// Store is the durable job state: every role, for the code that opens a
// job's store and hands each part to its consumer.
type Store interface {
	Configs
	Queue
	Outcomes
	Requeue
	Intake
	Journal
	Reader
	Ownership
	Captures

	// Info describes the backend.
	Info() Info
	Close() error
}

// Queue is the lease state machine a worker drives (package dispatch):
// claim, keep, and settle samples.
type Queue interface {
	// Claim leases up to n pending samples of lane whose retry time has come,
	// to owner until now+lease: conversations waiting for a later turn
	// first (oldest first among them), so a turn follows its previous one
	// while that prefix is still cached, then the oldest (first ingested).
	Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]Claimed, error)
	// ClaimKept is Claim for a caller that keeps the histories of the
	// conversations it runs (package dispatch, history.go): a claimed
	// sample that kept names at the very turn claimed, whose last claim
	// was the caller's lease kept's Token, comes back Kept, without Body
	// and Prior (reading them again is most of a long conversation's
	// claim). That is safe because each turn is stored exactly once, under
	// the lease that claimed it, and a body never changes but with a new
	// generation, which returns the sample to its first turn: when the
	// caller stored turn Turn-1 under lease Token and no claim came
	// between (the token says so where the backend keeps tokens; a store
	// without them has one runner, and a new generation only starts with
	// no runner live), the body and the answers it kept are the store's.
	// Any other claimed sample comes back whole, as from Claim.
	ClaimKept(ctx context.Context, lane string, n int, owner string, lease time.Duration, kept []Kept) ([]Claimed, error)
	// ExtendLeases pushes the lease of every sample owner holds to now+lease.
	ExtendLeases(ctx context.Context, owner string, lease time.Duration) error
	// Commit runs one lease transition; a non-zero Token fences it to the
	// lease claimed with that token, so a worker's answer from a lease it
	// lost is refused (ErrNotLeased) even after the same worker claimed
	// the sample again. A result must answer the sample's current turn
	// (ErrWrongTurn otherwise).
	Commit(ctx context.Context, t Transition) error
	// Release returns samples to pending without spending an attempt
	// (server outage, drain on shutdown). Listed samples owner no longer
	// holds are skipped, not an error.
	Release(ctx context.Context, ids []string, owner string) error
	// ReleaseOwnerExcept returns every sample leased by owner except those
	// in keep to pending without spending attempts, and reports how many:
	// the reconcile after an ambiguous write (a claim whose reply was lost
	// may have leased samples the caller never received).
	ReleaseOwnerExcept(ctx context.Context, owner string, keep []string) (int, error)
	// ExpireLeases returns samples whose lease ended before now to pending
	// and reports how many.
	ExpireLeases(ctx context.Context, now time.Time) (int, error)
	// Counts returns sample counts per partition, lane and state.
	Counts(ctx context.Context) ([]Count, error)
	// RequeueDead returns dead samples whose last error contains
	// reasonContains ("" = all) to pending with their attempts reset, after
	// the cause (a misconfiguration, a server bug) is fixed. It reports how many.
	RequeueDead(ctx context.Context, reasonContains string) (int, error)
}

// Outcomes are Commit's shorthands without a fencing token, for tools and
// tests; Shorthands implements them over any Committer.
type Outcomes interface {
	// Complete stores r and marks the sample done, in one transaction.
	Complete(ctx context.Context, id, owner string, r Result) error
	// Reject stores r with the quality rule that rejected it and the
	// evidence, and marks the sample rejected.
	Reject(ctx context.Context, id, owner string, r Result, rule, evidence string) error
	// CompleteTurn stores r as the answer to the sample's current turn
	// and returns the sample to pending at the next turn, in lane nextLane
	// ("" = the same lane), with no attempts spent, all in one
	// transaction. A turn is stored exactly once.
	CompleteTurn(ctx context.Context, id, owner string, r Result, nextLane string) error
	// Retry returns the sample to pending, spending one attempt, not to be
	// claimed before notBefore; lastErr is kept for status.
	Retry(ctx context.Context, id, owner string, notBefore time.Time, lastErr string) error
	// DeadLetter marks the sample dead with reason, spending the attempt.
	DeadLetter(ctx context.Context, id, owner, reason string) error
	// Escalate moves a leased sample to pending in another lane without
	// spending an attempt (truncated in a smaller lane).
	Escalate(ctx context.Context, id, owner, lane string) error
	// Relane moves a leased sample to another lane and keeps the lease,
	// spending nothing: its holder already has the answer of the lane it
	// escalates to (a backup that ran beside the truncated request) and
	// stores it next. A sample left there by a crash is redone in that lane.
	Relane(ctx context.Context, id, owner, lane string) error
}

// Requeue returns many samples to pending at once: a dead worker's leases
// (the runner's rescuer) and the operator's `regen requeue`.
type Requeue interface {
	// ReleaseOwner returns every sample leased by owner to pending without
	// spending attempts (the owner is known dead).
	ReleaseOwner(ctx context.Context, owner string) (int, error)
	// RequeueDead is Queue's.
	RequeueDead(ctx context.Context, reasonContains string) (int, error)
	// RequeueRejected returns rejected samples (of rule, "" = every rule)
	// to pending at the turn that was rejected, with attempts reset and the
	// rejected answer dropped; earlier turns are kept. It reports how many.
	RequeueRejected(ctx context.Context, rule string) (int, error)
}

// Intake is what ingest writes: samples, bad rows and the manifest of
// which source files are already fully ingested.
type Intake interface {
	// Ingest inserts samples whose ID is not yet present and returns how many
	// were new. Re-ingesting the same samples inserts nothing, except that a
	// sample held back for rebuilding (ConfigureOptions.Rebuild) takes the
	// new body, prompt tokens, lane and origin and becomes claimable.
	Ingest(ctx context.Context, samples []NewSample) (inserted int, err error)
	// DropStale deletes partition's samples still held back for rebuilding
	// (no source row gave their id again) and reports how many; ingest
	// calls it once every file of the partition is read.
	DropStale(ctx context.Context, partition string) (int, error)
	// AddIngestErrors records bad source rows; duplicates (same Partition and
	// Origin) are ignored: one row may be bad for two sources reading its file.
	AddIngestErrors(ctx context.Context, errs []IngestError) error
	// ForgetIngestErrors drops partition's bad rows recorded for the source
	// file named by origin prefix file (origins "file:..."), before the
	// partition reads the file again: a row bad in a truncated read may be
	// good now. Another partition reading the same file with its own mapping
	// keeps its bad rows: its read of the file is not repeated.
	ForgetIngestErrors(ctx context.Context, partition, file string) error
	// SourceFile returns the manifest entry of path in partition.
	SourceFile(ctx context.Context, partition, path string) (f SourceFile, ok bool, err error)
	// PutSourceFile records f, replacing the entry of its partition and path.
	PutSourceFile(ctx context.Context, f SourceFile) error
}

// Ownership is what records which job a store belongs to (package crew
// decides), and renames the source files the store names when the names
// an earlier regen stored absolute become relative to the job file.
type Ownership interface {
	// Meta returns the value recorded under key, ok=false when none is.
	Meta(ctx context.Context, key string) (value string, ok bool, err error)
	// SetMeta records value under key, unless one is recorded and replace
	// is false, and returns the value recorded now (of several callers at
	// once, the first wins).
	SetMeta(ctx context.Context, key, value string, replace bool) (string, error)
	// OriginFiles lists the source file names the store holds (origins and
	// the ingest manifest), sorted.
	OriginFiles(ctx context.Context) ([]string, error)
	// Relocate strips folder from (and its separator) off every stored
	// source file name under it, and reports how many names changed.
	Relocate(ctx context.Context, from string) (int, error)
}

// JournalReader reads the workers' journal: heartbeats, events and the
// dashboard's minutes.
type JournalReader interface {
	// LastHeartbeat returns the newest heartbeat (by Time) of any worker,
	// ok=false if none was written.
	LastHeartbeat(ctx context.Context) (hb Heartbeat, ok bool, err error)
	// Heartbeats returns the latest heartbeat of every worker that ever
	// wrote one, newest first.
	Heartbeats(ctx context.Context) ([]Heartbeat, error)
	// Events returns the newest events first.
	Events(ctx context.Context, limit int) ([]Event, error)
	// Minutes returns the rows whose Time is at or after since, oldest
	// first (then by Worker and Endpoint).
	Minutes(ctx context.Context, since time.Time) ([]Minute, error)
}

// Journal is what the workers record about themselves: proof of life,
// events, the dashboard's history, and named locks between them.
type Journal interface {
	JournalReader
	// PutHeartbeat replaces hb.Owner's heartbeat.
	PutHeartbeat(ctx context.Context, hb Heartbeat) error
	// AddEvent appends e; a zero Time is stamped with the store's clock.
	AddEvent(ctx context.Context, e Event) error
	// PutMinutes inserts or replaces rows keyed by (Time, Worker, Endpoint).
	PutMinutes(ctx context.Context, ms []Minute) error
	// TryLock takes the named lock if no one holds it, without waiting, and
	// returns the function that releases it; ok is false while another
	// holder (in this process or another one sharing the store) has it. A
	// holder that dies releases its locks. Locks are not reentrant.
	TryLock(ctx context.Context, name string) (unlock func() error, ok bool, err error)
}

// Reader is everything the views read about what the job produced.
type Reader interface {
	Progress
	Statistics
	Browse
	Dataset
}

// Progress is the job's headline numbers (status, stats, the manifest).
type Progress interface {
	// Counts returns sample counts per partition, lane and state.
	Counts(ctx context.Context) ([]Count, error)
	// ThroughputSince sums finished work since t: samples done or rejected,
	// and the tokens of every answer stored (earlier turns included).
	ThroughputSince(ctx context.Context, t time.Time) (Throughput, error)
	// RejectCounts returns the rejected samples per partition, lane and rule.
	RejectCounts(ctx context.Context) ([]RejectCount, error)
	// IngestErrorCount returns how many distinct bad rows (by Origin) are recorded.
	IngestErrorCount(ctx context.Context) (int, error)
	// Generations is Configs'.
	Generations(ctx context.Context) ([]Generation, error)
}

// Statistics are the dataset's sums, kept up to date with every stored
// answer so that reading them costs the same for 10^3 samples as for 10^7.
type Statistics interface {
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
}

// Browse is the bounded listings the sample browser and status show.
type Browse interface {
	// Sample returns one sample in any state, with its body, its last
	// answer (Result) and the answers to its earlier turns (Prior, also
	// while it is in progress); Reason and Rule are the reject's evidence
	// and rule, else Reason is the last error; ok=false if unknown.
	Sample(ctx context.Context, id string) (row Row, ok bool, err error)
	// Samples lists the samples matching q in ID order, without Body,
	// Result.Response and Prior (a listing must stay small whatever the
	// prompts are).
	Samples(ctx context.Context, q SampleQuery) ([]Row, error)
	// LastErrors returns the samples with the most recent retry/dead-letter
	// reasons, newest first; rows carry no Result and State is the current one.
	LastErrors(ctx context.Context, limit int) ([]Row, error)
	// IngestErrors returns bad rows in the order first recorded, for short
	// listings. A wrong field mapping makes every source row bad, so callers
	// that need all of them use IngestErrorCount or Dataset.EachIngestError,
	// whose memory does not grow with the source.
	IngestErrors(ctx context.Context, limit int) ([]IngestError, error)
	// IngestErrorCount is Progress'.
	IngestErrorCount(ctx context.Context) (int, error)
}

// Dataset is the walks over the whole job that export streams its files
// from; each holds memory to a page whatever the job's size.
type Dataset interface {
	// Finished calls fn for every done, rejected or dead sample in ID order.
	Finished(ctx context.Context, fn func(Row) error) error
	// EachIngestError calls fn for every recorded bad row, once each, in
	// the order first recorded (source order: ingest reads files and lines
	// in order). It reads a bounded page at a time and holds
	// nothing while fn runs, so fn may call the store. An error from fn
	// stops the walk and is returned unwrapped.
	EachIngestError(ctx context.Context, fn func(IngestError) error) error
	// EachTokenCount is Statistics'.
	EachTokenCount(ctx context.Context, fn func(TokenCount) error) error
}
