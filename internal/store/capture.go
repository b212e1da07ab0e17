package store

import (
	"context"
	"time"
)

// WholeConversation is CaptureKey.Turn for a capture of a whole
// conversation (output.token_rows: conversation); a turn row's capture
// names its 0-based turn index.
const WholeConversation = -1

// CaptureKey names one capture: a done sample's whole conversation (Key =
// the sample id, Turn = WholeConversation) or one of its turn rows (Key =
// "<id>/turn<k>", Turn = k).
type CaptureKey struct {
	Key      string
	SampleID string
	Turn     int
	// Input is the sha256 (hex) of the ids the capture sends: a key
	// captured (or dead) for other ids, such as a sample generated again
	// under a new configuration, is claimed and captured again. "" (a row
	// recorded before inputs were kept) matches any input.
	Input string
}

// CaptureState is where a key's capture is, and for which input.
type CaptureState struct {
	State State
	Input string
}

// CaptureClaim is a capture leased to a worker. Token fences the lease:
// RecordCapture, FailCapture and ReleaseCapture take only under the very
// claim that returned it.
type CaptureClaim struct {
	CaptureKey
	Owner      string
	Token      int64
	Attempts   int // attempts spent on this key so far (failures of its own file)
	LastError  string
	LeaseUntil time.Time
	// ServerPath is the server's file an earlier attempt at this key was
	// handed and did not settle (NoteCaptureServerPath): the new holder
	// removes it, with its lock, if it is still there. "" when none, or
	// when another key's row names the same path (never this key's).
	ServerPath string
}

// CapturedFile is the record of one captured hidden-state file: where it
// is (Path, relative to the job file's folder) and what it holds.
type CapturedFile struct {
	CaptureKey
	Path       string
	Bytes      int64
	SHA256     string // hex
	Tokens     int
	Layers     int
	Hidden     int
	DType      string
	CapturedAt time.Time
}

// CaptureFailure is a capture that failed with its own file (a dead one,
// or one still being retried): the evidence of its last failure.
type CaptureFailure struct {
	CaptureKey
	State     State // Dead, or Pending/Leased while attempts remain
	Attempts  int
	LastError string
}

// CaptureCounts are the capture's headline numbers.
type CaptureCounts struct {
	Captured int
	Dead     int
	Leased   int
	Pending  int   // released or failed, to be claimed again
	Bytes    int64 // of the captured files
	Tokens   int64 // of the captured files
}

// Captures is the hidden-state capture's table (package capture): one row
// per capture key, claimed under a lease with a fencing token like a
// sample, and recorded exactly once with its file.
//
// A key has no row until it is first claimed; it is then leased, pending
// (released, or failed with attempts left), captured or dead. Only
// FailCapture spends an attempt; ReleaseCapture and ReleaseCaptures never
// do (a server outage, a drain). A recorded file's path is unique: two
// keys never list one file.
type Captures interface {
	// ClaimCapture leases k to owner until now+lease, creating its row
	// if none exists, unless it is leased to a lease that has not ended,
	// or captured or dead for the same input (ok=false then). A key
	// captured or dead for another input starts again at zero attempts.
	ClaimCapture(ctx context.Context, k CaptureKey, owner string, lease time.Duration) (c CaptureClaim, ok bool, err error)
	// ExtendCaptureLeases pushes every capture lease owner holds to now+lease.
	ExtendCaptureLeases(ctx context.Context, owner string, lease time.Duration) error
	// ConfirmCapture says c's lease still holds and pushes it to
	// now+lease; ErrNotLeased if it was lost (the key claimed again or
	// settled). A worker confirms before it touches a file at the key's
	// name that it did not place.
	ConfirmCapture(ctx context.Context, c CaptureClaim, lease time.Duration) error
	// NoteCaptureServerPath records, durably and under c's lease, the
	// server's file a capture server just named for c's key, before the
	// file is read or moved: a worker killed before it settles the file
	// leaves the path for the key's next holder (CaptureClaim.ServerPath).
	// RecordCapture and FailCapture clear it. ErrNotLeased if c's lease
	// was lost.
	NoteCaptureServerPath(ctx context.Context, c CaptureClaim, path string) error
	// LeftServerPaths returns, for each key not leased whose row names a
	// server path no other row names, that path (key -> path): what
	// interrupted attempts left, for a sole worker to remove at its start.
	LeftServerPaths(ctx context.Context) (map[string]string, error)
	// ClearServerPath forgets key's server path once it is removed, if the
	// row still names path and is not leased.
	ClearServerPath(ctx context.Context, key, path string) error
	// RecordCapture records f as the file of c's key and marks it captured,
	// in one transaction; ErrNotLeased if c's lease was lost.
	RecordCapture(ctx context.Context, c CaptureClaim, f CapturedFile) error
	// FailCapture spends one attempt on c's key with evidence; dead marks
	// it dead (no more attempts), else the lease is kept for the holder's
	// next attempt. ErrNotLeased if c's lease was lost.
	FailCapture(ctx context.Context, c CaptureClaim, evidence string, dead bool) error
	// ReleaseCapture returns c's key to pending without spending an attempt.
	ReleaseCapture(ctx context.Context, c CaptureClaim) error
	// ReleaseCaptures returns every capture leased by owner ("" = by
	// anyone: the caller knows no other worker runs) to pending without
	// spending attempts, and reports how many.
	ReleaseCaptures(ctx context.Context, owner string) (int, error)
	// CaptureStates returns the state and input of each listed key that
	// has a row (keys never claimed are absent).
	CaptureStates(ctx context.Context, keys []string) (map[string]CaptureState, error)
	// CaptureCounts returns the capture's headline numbers.
	CaptureCounts(ctx context.Context) (CaptureCounts, error)
	// EachCapturedFile calls fn for every captured file in key order,
	// reading a bounded page at a time and holding nothing while fn runs.
	// An error from fn stops the walk and is returned unwrapped.
	EachCapturedFile(ctx context.Context, fn func(CapturedFile) error) error
	// CaptureFailures returns up to limit keys with a failure of their
	// own (dead ones first, then by key); limit <= 0 means no limit.
	CaptureFailures(ctx context.Context, limit int) ([]CaptureFailure, error)
	// RequeueDeadCaptures returns dead captures whose last error contains
	// reasonContains ("" = all) to pending with attempts reset, and
	// reports how many.
	RequeueDeadCaptures(ctx context.Context, reasonContains string) (int, error)
	// RequeueCaptured returns a captured key to pending with attempts
	// reset and reason as its last error (its file was found missing or
	// changed), and reports whether it was captured.
	RequeueCaptured(ctx context.Context, key, reason string) (bool, error)
}

// Add counts n captures in state st holding bytes and tokens (backends
// sum their rows through it).
func (c *CaptureCounts) Add(st State, n int, bytes, tokens int64) {
	switch st {
	case Done:
		c.Captured += n
		c.Bytes += bytes
		c.Tokens += tokens
	case Dead:
		c.Dead += n
	case Leased:
		c.Leased += n
	case Pending:
		c.Pending += n
	}
}
