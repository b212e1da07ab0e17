package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/regen-dev/regen/internal/store"
)

// commitBatch runs a batch of transitions in one transaction, each
// statement guarded by the lease. If the transaction fails (a bad value in
// one request, a full disk), every request is tried again in a transaction
// of its own, so only the culprit fails.
func (s *Store) commitBatch(ctx context.Context, batch []store.Transition) []error {
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

// applyAll runs every store.Transition in tx, in order, recording ErrNotLeased
// for those whose lease is gone; any other error aborts the transaction.
func (s *Store) applyAll(ctx context.Context, tx *sql.Tx, batch []store.Transition, errs []error) error {
	clear(errs) // outcomes of an earlier, failed attempt do not carry over
	now := ns(s.now())
	for i, t := range batch {
		err := s.apply(ctx, tx, t, now)
		switch {
		case errors.Is(err, store.ErrNotLeased), errors.Is(err, store.ErrWrongTurn):
			errs[i] = err
		case err != nil:
			return fmt.Errorf("sample %s: %w", t.ID, err)
		}
	}
	return nil
}

func (s *Store) apply(ctx context.Context, tx *sql.Tx, t store.Transition, now int64) error {
	switch t.Op {
	case store.OpFinish:
		// The result goes in only if the caller holds the sample at the
		// result's turn; the sample row follows in the same transaction.
		r := t.Result
		res, err := s.exec(ctx, tx, insertResultSQL,
			blob(r.Response), r.FinishReason, r.PromptTokens, r.CompletionTokens, r.Endpoint,
			int64(r.Duration), int64(r.TTFT), t.Evidence, now, r.ReasoningTokens, t.Rule, r.EndReason, r.Generation,
			t.ID, t.Owner, r.Turn)
		if err := s.heldAt(ctx, tx, res, err, t.ID, t.Owner); err != nil {
			return err
		}
		_, err = s.exec(ctx, tx, finishSQL, string(t.State), now, t.ID)
		return err
	case store.OpTurn:
		r := t.Result
		res, err := s.exec(ctx, tx, insertTurnSQL,
			blob(r.Response), r.FinishReason, r.PromptTokens, r.CompletionTokens, r.ReasoningTokens, r.Endpoint,
			int64(r.Duration), int64(r.TTFT), now, r.Generation, t.ID, t.Owner, r.Turn)
		if err := s.heldAt(ctx, tx, res, err, t.ID, t.Owner); err != nil {
			return err
		}
		_, err = s.exec(ctx, tx, nextTurnSQL, t.Lane, t.Lane, t.ID)
		return err
	case store.OpRetry:
		return held(s.exec(ctx, tx, retrySQL, ns(t.NotBefore), t.LastError, now, t.ID, t.Owner))
	case store.OpDefer:
		return held(s.exec(ctx, tx, deferSQL, ns(t.NotBefore), t.LastError, now, t.ID, t.Owner))
	case store.OpDead:
		return held(s.exec(ctx, tx, deadSQL, t.Reason, now, now, t.ID, t.Owner))
	case store.OpEscalate:
		return held(s.exec(ctx, tx, escalateSQL, t.Lane, t.ID, t.Owner))
	case store.OpRelane:
		return held(s.exec(ctx, tx, relaneSQL, t.Lane, t.ID, t.Owner))
	}
	return fmt.Errorf("unknown store.Transition %d", t.Op)
}
