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
)

// Transition is one queued lease transition. Text is the reject evidence,
// the next turn's lane, the retry's last error, the dead-letter reason or
// the target lane; Rule is a reject's quality rule.
type Transition struct {
	Op        Op
	ID, Owner string
	State     State // OpFinish: Done or Rejected
	Result    Result
	Text      string
	Rule      string
	NotBefore time.Time
}

// Transitions implements the lease transitions of Store (Complete, Reject,
// CompleteTurn, Retry, DeadLetter, Escalate) by queueing them for a
// backend's group commit; the backend embeds it and commits the batches.
type Transitions struct {
	Commits *groupcommit.Queue[Transition]
}

// Complete stores r and marks the sample done, spending its attempt.
func (t Transitions) Complete(ctx context.Context, id, owner string, r Result) error {
	if err := t.Commits.Do(ctx, Transition{Op: OpFinish, ID: id, Owner: owner, State: Done, Result: r}); err != nil {
		return fmt.Errorf("complete %s: %w", id, err)
	}
	return nil
}

// Reject stores r with its rule and evidence and marks the sample
// rejected, spending its attempt.
func (t Transitions) Reject(ctx context.Context, id, owner string, r Result, rule, evidence string) error {
	if rule == "" {
		return fmt.Errorf("reject %s: no rule", id)
	}
	if err := t.Commits.Do(ctx, Transition{Op: OpFinish, ID: id, Owner: owner, State: Rejected, Result: r, Rule: rule, Text: evidence}); err != nil {
		return fmt.Errorf("reject %s: %w", id, err)
	}
	return nil
}

// CompleteTurn stores the answer to the held sample's current turn and
// returns it to pending at the next turn (in nextLane, "" = the same lane),
// in one transaction.
func (t Transitions) CompleteTurn(ctx context.Context, id, owner string, r Result, nextLane string) error {
	if err := t.Commits.Do(ctx, Transition{Op: OpTurn, ID: id, Owner: owner, Result: r, Text: nextLane}); err != nil {
		return fmt.Errorf("complete turn %d of %s: %w", r.Turn, id, err)
	}
	return nil
}

// Retry returns the held sample to pending, spending one attempt.
func (t Transitions) Retry(ctx context.Context, id, owner string, notBefore time.Time, lastErr string) error {
	if err := t.Commits.Do(ctx, Transition{Op: OpRetry, ID: id, Owner: owner, NotBefore: notBefore, Text: lastErr}); err != nil {
		return fmt.Errorf("retry %s: %w", id, err)
	}
	return nil
}

// DeadLetter marks the held sample dead with reason, spending its attempt.
func (t Transitions) DeadLetter(ctx context.Context, id, owner, reason string) error {
	if err := t.Commits.Do(ctx, Transition{Op: OpDead, ID: id, Owner: owner, Text: reason}); err != nil {
		return fmt.Errorf("dead-letter %s: %w", id, err)
	}
	return nil
}

// Escalate moves the held sample to pending in lane without spending an attempt.
func (t Transitions) Escalate(ctx context.Context, id, owner, lane string) error {
	if err := t.Commits.Do(ctx, Transition{Op: OpEscalate, ID: id, Owner: owner, Text: lane}); err != nil {
		return fmt.Errorf("escalate %s to %s: %w", id, lane, err)
	}
	return nil
}

// Relane moves the held sample to lane and keeps it leased.
func (t Transitions) Relane(ctx context.Context, id, owner, lane string) error {
	if err := t.Commits.Do(ctx, Transition{Op: OpRelane, ID: id, Owner: owner, Text: lane}); err != nil {
		return fmt.Errorf("move %s to lane %s: %w", id, lane, err)
	}
	return nil
}
