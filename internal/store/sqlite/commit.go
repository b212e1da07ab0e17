package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// opKind is a lease transition the group committer runs.
type opKind uint8

const (
	opFinish   opKind = iota // done or rejected, with the result of the current turn
	opTurn                   // the current turn's answer stored, pending at the next turn
	opRetry                  // pending again after notBefore, one attempt spent
	opDead                   // dead with a reason, one attempt spent
	opEscalate               // pending in another lane, no attempt spent
)

// transition is one queued request; text is the reject evidence, the next
// turn's lane, the retry's last error, the dead-letter reason or the target
// lane; rule is a reject's quality rule.
type transition struct {
	kind      opKind
	id, owner string
	state     store.State // opFinish: Done or Rejected
	result    store.Result
	text      string
	rule      string
	notBefore time.Time
}

// commitBatch runs a batch of transitions in one transaction, each
// statement guarded by the lease. If the transaction fails (a bad value in
// one request, a full disk), every request is tried again in a transaction
// of its own, so only the culprit fails.
func (s *Store) commitBatch(ctx context.Context, batch []transition) []error {
	errs := make([]error, len(batch))
	err := s.inTx(ctx, func(tx *sql.Tx) error { return s.applyAll(ctx, tx, batch, errs) })
	if err == nil || len(batch) == 1 {
		if err != nil {
			errs[0] = err
		}
		return errs
	}
	for i := range batch {
		one := errs[i : i+1]
		if err := s.inTx(ctx, func(tx *sql.Tx) error { return s.applyAll(ctx, tx, batch[i:i+1], one) }); err != nil {
			one[0] = err
		}
	}
	return errs
}

// applyAll runs every transition in tx, in order, recording ErrNotLeased
// for those whose lease is gone; any other error aborts the transaction.
func (s *Store) applyAll(ctx context.Context, tx *sql.Tx, batch []transition, errs []error) error {
	clear(errs) // outcomes of an earlier, failed attempt do not carry over
	now := ns(s.now())
	for i, t := range batch {
		err := s.apply(ctx, tx, t, now)
		switch {
		case errors.Is(err, store.ErrNotLeased), errors.Is(err, store.ErrWrongTurn):
			errs[i] = err
		case err != nil:
			return fmt.Errorf("sample %s: %w", t.id, err)
		}
	}
	return nil
}

func (s *Store) apply(ctx context.Context, tx *sql.Tx, t transition, now int64) error {
	switch t.kind {
	case opFinish:
		// The result goes in only if the caller holds the sample at the
		// result's turn; the sample row follows in the same transaction.
		r := t.result
		res, err := s.exec(ctx, tx, insertResultSQL,
			blob(r.Response), r.FinishReason, r.PromptTokens, r.CompletionTokens, r.Endpoint,
			int64(r.Duration), int64(r.TTFT), t.text, now, r.ReasoningTokens, t.rule, r.EndReason,
			t.id, t.owner, r.Turn)
		if err := s.heldAt(ctx, tx, res, err, t.id, t.owner); err != nil {
			return err
		}
		_, err = s.exec(ctx, tx, finishSQL, string(t.state), now, t.id)
		return err
	case opTurn:
		r := t.result
		res, err := s.exec(ctx, tx, insertTurnSQL,
			blob(r.Response), r.FinishReason, r.PromptTokens, r.CompletionTokens, r.ReasoningTokens, r.Endpoint,
			int64(r.Duration), int64(r.TTFT), now, t.id, t.owner, r.Turn)
		if err := s.heldAt(ctx, tx, res, err, t.id, t.owner); err != nil {
			return err
		}
		_, err = s.exec(ctx, tx, nextTurnSQL, t.text, t.text, t.id)
		return err
	case opRetry:
		return held(s.exec(ctx, tx, retrySQL, ns(t.notBefore), t.text, now, t.id, t.owner))
	case opDead:
		return held(s.exec(ctx, tx, deadSQL, t.text, now, now, t.id, t.owner))
	case opEscalate:
		return held(s.exec(ctx, tx, escalateSQL, t.text, t.id, t.owner))
	}
	return fmt.Errorf("unknown transition %d", t.kind)
}

// Complete stores r and marks the sample done, spending its attempt.
func (s *Store) Complete(ctx context.Context, id, owner string, r store.Result) error {
	if err := s.commits.Do(ctx, transition{kind: opFinish, id: id, owner: owner, state: store.Done, result: r}); err != nil {
		return fmt.Errorf("complete %s: %w", id, err)
	}
	return nil
}

// Reject stores r with its rule and evidence and marks the sample
// rejected, spending its attempt.
func (s *Store) Reject(ctx context.Context, id, owner string, r store.Result, rule, evidence string) error {
	if rule == "" {
		return fmt.Errorf("reject %s: no rule", id)
	}
	if err := s.commits.Do(ctx, transition{kind: opFinish, id: id, owner: owner, state: store.Rejected, result: r, rule: rule, text: evidence}); err != nil {
		return fmt.Errorf("reject %s: %w", id, err)
	}
	return nil
}

// CompleteTurn stores the answer to the held sample's current turn and
// returns it to pending at the next turn (in nextLane, "" = the same lane),
// in one transaction.
func (s *Store) CompleteTurn(ctx context.Context, id, owner string, r store.Result, nextLane string) error {
	if err := s.commits.Do(ctx, transition{kind: opTurn, id: id, owner: owner, result: r, text: nextLane}); err != nil {
		return fmt.Errorf("complete turn %d of %s: %w", r.Turn, id, err)
	}
	return nil
}

// Retry returns the held sample to pending, spending one attempt.
func (s *Store) Retry(ctx context.Context, id, owner string, notBefore time.Time, lastErr string) error {
	if err := s.commits.Do(ctx, transition{kind: opRetry, id: id, owner: owner, notBefore: notBefore, text: lastErr}); err != nil {
		return fmt.Errorf("retry %s: %w", id, err)
	}
	return nil
}

// DeadLetter marks the held sample dead with reason, spending its attempt.
func (s *Store) DeadLetter(ctx context.Context, id, owner, reason string) error {
	if err := s.commits.Do(ctx, transition{kind: opDead, id: id, owner: owner, text: reason}); err != nil {
		return fmt.Errorf("dead-letter %s: %w", id, err)
	}
	return nil
}

// Escalate moves the held sample to pending in lane without spending an attempt.
func (s *Store) Escalate(ctx context.Context, id, owner, lane string) error {
	if err := s.commits.Do(ctx, transition{kind: opEscalate, id: id, owner: owner, text: lane}); err != nil {
		return fmt.Errorf("escalate %s to %s: %w", id, lane, err)
	}
	return nil
}
