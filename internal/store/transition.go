package store

import (
	"context"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/store/groupcommit"
)

// Op is a lease transition a backend's group committer runs.
type Op uint8

const (
	OpFinish   Op = iota // done or rejected, with the result of the current turn
	OpTurn               // the current turn's answer stored, pending at the next turn
	OpRetry              // pending again after NotBefore, one attempt spent
	OpDead               // dead with a reason, one attempt spent
	OpEscalate           // pending in another lane, no attempt spent
	OpRelane             // still leased, in another lane
	// OpDefer: pending again after NotBefore, no attempt spent: a server
	// error judged the endpoint's, not the sample's (dispatch's burn
	// guard), whose sample must not come straight back to the same server.
	OpDefer
)

// Transition is one queued lease transition. Each field other than Op,
// ID, Owner and Token belongs to the ops its comment names and is ignored
// by the others. Token, when not zero, is the fencing token of the lease
// the caller claimed (Claimed.Token): the transition then takes only if
// that very lease is still held, not merely one of the same owner (a
// worker that claimed the sample again after losing it).
type Transition struct {
	Op        Op
	ID, Owner string
	Token     int64
	State     State  // OpFinish: Done or Rejected
	Result    Result // OpFinish, OpTurn: the answer to the current turn
	Rule      string // OpFinish Rejected: the quality rule
	Evidence  string // OpFinish Rejected: why the rule rejected the answer
	// Lane is the lane the sample moves to: the target of OpEscalate and
	// OpRelane, the next turn's lane for OpTurn ("" = the same lane).
	Lane      string
	LastError string    // OpRetry, OpDefer: the error status shows
	NotBefore time.Time // OpRetry, OpDefer: not claimed again before
	Reason    string    // OpDead: the dead-letter reason
}

// Committer runs one lease transition; every backend's Commit is one.
type Committer interface {
	Commit(ctx context.Context, t Transition) error
}

// Transitions implements Commit by queueing transitions for a backend's
// group commit, and the Outcomes over it; the backend embeds it and
// commits the batches.
type Transitions struct {
	Commits *groupcommit.Queue[Transition]
}

// Commit runs one lease transition, fenced by tr.Token when it is not
// zero, and returns once it has committed; ErrNotLeased says the lease is
// gone.
func (t Transitions) Commit(ctx context.Context, tr Transition) error {
	if tr.Op == OpFinish && tr.State == Rejected && tr.Rule == "" {
		return fmt.Errorf("reject %s: no rule", tr.ID)
	}
	if err := t.Commits.Do(ctx, tr); err != nil {
		return fmt.Errorf("%s: %w", tr.describe(), err)
	}
	return nil
}

// describe names the transition for error messages.
func (tr Transition) describe() string {
	switch tr.Op {
	case OpFinish:
		if tr.State == Rejected {
			return "reject " + tr.ID
		}
		return "complete " + tr.ID
	case OpTurn:
		return fmt.Sprintf("complete turn %d of %s", tr.Result.Turn+1, tr.ID) // 1-based for people, as conversation.Ordinal
	case OpRetry:
		return "retry " + tr.ID
	case OpDead:
		return "dead-letter " + tr.ID
	case OpEscalate:
		return fmt.Sprintf("escalate %s to %s", tr.ID, tr.Lane)
	case OpRelane:
		return fmt.Sprintf("move %s to lane %s", tr.ID, tr.Lane)
	case OpDefer:
		return "defer " + tr.ID
	}
	return fmt.Sprintf("transition %d of %s", tr.Op, tr.ID)
}

// Complete stores r and marks the sample done, spending its attempt.
func (t Transitions) Complete(ctx context.Context, id, owner string, r Result) error {
	return Shorthands{t}.Complete(ctx, id, owner, r)
}

// Reject stores r with its rule and evidence and marks the sample
// rejected, spending its attempt.
func (t Transitions) Reject(ctx context.Context, id, owner string, r Result, rule, evidence string) error {
	return Shorthands{t}.Reject(ctx, id, owner, r, rule, evidence)
}

// CompleteTurn stores the answer to the held sample's current turn and
// returns it to pending at the next turn (in nextLane, "" = the same lane),
// in one transaction.
func (t Transitions) CompleteTurn(ctx context.Context, id, owner string, r Result, nextLane string) error {
	return Shorthands{t}.CompleteTurn(ctx, id, owner, r, nextLane)
}

// Retry returns the held sample to pending, spending one attempt.
func (t Transitions) Retry(ctx context.Context, id, owner string, notBefore time.Time, lastErr string) error {
	return Shorthands{t}.Retry(ctx, id, owner, notBefore, lastErr)
}

// DeadLetter marks the held sample dead with reason, spending its attempt.
func (t Transitions) DeadLetter(ctx context.Context, id, owner, reason string) error {
	return Shorthands{t}.DeadLetter(ctx, id, owner, reason)
}

// Escalate moves the held sample to pending in lane without spending an attempt.
func (t Transitions) Escalate(ctx context.Context, id, owner, lane string) error {
	return Shorthands{t}.Escalate(ctx, id, owner, lane)
}

// Relane moves the held sample to lane and keeps it leased.
func (t Transitions) Relane(ctx context.Context, id, owner, lane string) error {
	return Shorthands{t}.Relane(ctx, id, owner, lane)
}

// Shorthands implements Outcomes over any Committer: each method is one
// transition without a fencing token.
type Shorthands struct{ Committer }

// Complete stores r and marks the sample done, spending its attempt.
func (s Shorthands) Complete(ctx context.Context, id, owner string, r Result) error {
	return s.Commit(ctx, Transition{Op: OpFinish, ID: id, Owner: owner, State: Done, Result: r})
}

// Reject stores r with its rule and evidence and marks the sample
// rejected, spending its attempt.
func (s Shorthands) Reject(ctx context.Context, id, owner string, r Result, rule, evidence string) error {
	return s.Commit(ctx, Transition{Op: OpFinish, ID: id, Owner: owner, State: Rejected, Result: r, Rule: rule, Evidence: evidence})
}

// CompleteTurn stores the answer to the held sample's current turn and
// returns it to pending at the next turn (in nextLane, "" = the same lane).
func (s Shorthands) CompleteTurn(ctx context.Context, id, owner string, r Result, nextLane string) error {
	return s.Commit(ctx, Transition{Op: OpTurn, ID: id, Owner: owner, Result: r, Lane: nextLane})
}

// Retry returns the held sample to pending, spending one attempt.
func (s Shorthands) Retry(ctx context.Context, id, owner string, notBefore time.Time, lastErr string) error {
	return s.Commit(ctx, Transition{Op: OpRetry, ID: id, Owner: owner, NotBefore: notBefore, LastError: lastErr})
}

// DeadLetter marks the held sample dead with reason, spending its attempt.
func (s Shorthands) DeadLetter(ctx context.Context, id, owner, reason string) error {
	return s.Commit(ctx, Transition{Op: OpDead, ID: id, Owner: owner, Reason: reason})
}

// Escalate moves the held sample to pending in lane without spending an attempt.
func (s Shorthands) Escalate(ctx context.Context, id, owner, lane string) error {
	return s.Commit(ctx, Transition{Op: OpEscalate, ID: id, Owner: owner, Lane: lane})
}

// Relane moves the held sample to lane and keeps it leased.
func (s Shorthands) Relane(ctx context.Context, id, owner, lane string) error {
	return s.Commit(ctx, Transition{Op: OpRelane, ID: id, Owner: owner, Lane: lane})
}
