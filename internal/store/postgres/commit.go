package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// finishSQL finishes a whole batch in one statement: the UPDATE, guarded by
// lease and turn, returns the samples still held at the result's turn; only
// those get a result row; counts and statistics move with them. The rows it
// returns say which requests succeeded (true) and which hold their sample
// at another turn (false, with that turn); a request in neither lost its
// lease.
var finishSQL = `WITH v AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::int2[], $4::bytea[], $5::text[], $6::int4[], $7::int4[],
			$8::text[], $9::int8[], $10::int8[], $11::text[], $12::text[], $13::int4[], $14::int4[], $15::text[], $17::int4[], $18::int8[])
			AS v(id, owner, state, response, finish_reason, prompt_tokens, completion_tokens, endpoint, duration_ns, ttft_ns,
				reason, rule, turn, reasoning_tokens, end_reason, generation, token)
	), u AS (
		UPDATE samples s SET state = v.state, attempts = s.attempts + 1, finished_at = $16, lease_owner = NULL, lease_until = NULL
		FROM v WHERE s.id = v.id AND s.state = 1 AND s.lease_owner = v.owner AND (v.token = 0 OR s.lease_token = v.token) AND s.turn = v.turn
		RETURNING s.id, s.partition, s.lane AS lane_from, 1::int2 AS state_from, s.lane, s.state
	), ` + countsCTE + `, a AS (
		INSERT INTO results (sample_id, response, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, endpoint,
			duration_ns, ttft_ns, reason, rule, end_reason, turn, partition, lane, finished_at, generation)
		SELECT v.id, v.response, v.finish_reason, v.prompt_tokens, v.completion_tokens, v.reasoning_tokens, v.endpoint,
			v.duration_ns, v.ttft_ns, v.reason, v.rule, v.end_reason, v.turn, u.partition, u.lane, $16, v.generation
		FROM v JOIN u ON u.id = v.id
		RETURNING sample_id, ` + answerCols + `
	), ` + statsCTEs("a", 1, true) + `
	SELECT sample_id, true, 0 FROM a
	UNION ALL
	SELECT s.id, false, s.turn FROM samples s JOIN v ON s.id = v.id
	WHERE s.state = 1 AND s.lease_owner = v.owner AND (v.token = 0 OR s.lease_token = v.token) AND s.turn <> v.turn`

// turnSQL stores the answer to a held sample's current turn and returns the
// sample to pending at the next turn, with no attempt spent, in one
// statement. The held row is locked first, so the lease cannot move between
// storing the turn and advancing the sample. It returns (true, 0) when
// done, (false, turn) when the sample is held at another turn, and no row
// when the lease is gone.
var turnSQL = `WITH h AS (
		SELECT id, turn, partition, lane, attempts FROM samples
		WHERE id = $1 AND state = 1 AND lease_owner = $2 AND ($15 = 0 OR lease_token = $15) FOR UPDATE
	), a AS (
		INSERT INTO turns (sample_id, turn, partition, lane, response, finish_reason, prompt_tokens, completion_tokens,
			reasoning_tokens, endpoint, duration_ns, ttft_ns, attempts, finished_at, generation)
		SELECT h.id, h.turn, h.partition, h.lane, $4, $5, $6, $7, $8, $9, $10, $11, h.attempts + 1, $12, $14
		FROM h WHERE h.turn = $3
		RETURNING sample_id, partition, lane, finish_reason, ''::text AS rule, reasoning_tokens, ''::text AS end_reason,
			prompt_tokens, completion_tokens, finished_at
	), u AS (
		UPDATE samples s SET state = 0, turn = s.turn + 1, attempts = 0, not_before = 0,
			lane = CASE WHEN $13 = '' THEN s.lane ELSE $13 END, lease_owner = NULL, lease_until = NULL
		FROM a WHERE s.id = a.sample_id AND s.state = 1 AND s.lease_owner = $2
		RETURNING s.partition, a.lane AS lane_from, 1::int2 AS state_from, s.lane, s.state
	), ` + countsCTE + `, ` + statsCTEs("a", 1, true) + `
	SELECT true, 0 FROM u
	UNION ALL
	SELECT false, h.turn FROM h WHERE h.turn <> $3`

var (
	retrySQL = movedSQL(`UPDATE samples SET state = 0, attempts = attempts + 1, not_before = $1,
			last_error = $2, last_error_at = $3, lease_owner = NULL, lease_until = NULL
		WHERE id = $4 AND state = 1 AND lease_owner = $5 AND ($6 = 0 OR lease_token = $6) `+moved("1"), "1")
	deferSQL = movedSQL(`UPDATE samples SET state = 0, not_before = $1,
			last_error = $2, last_error_at = $3, lease_owner = NULL, lease_until = NULL
		WHERE id = $4 AND state = 1 AND lease_owner = $5 AND ($6 = 0 OR lease_token = $6) `+moved("1"), "1")
	deadSQL = movedSQL(`UPDATE samples SET state = 4, attempts = attempts + 1, last_error = $1, last_error_at = $2,
			finished_at = $2, lease_owner = NULL, lease_until = NULL
		WHERE id = $3 AND state = 1 AND lease_owner = $4 AND ($5 = 0 OR lease_token = $5) `+moved("1"), "1")
	// The old lane comes from a read of the held row: only its holder can
	// change it, so it cannot move between the read and the update.
	escalateSQL = movedSQL(`UPDATE samples s SET state = 0, lane = $1, lease_owner = NULL, lease_until = NULL
		FROM (SELECT id, lane AS old_lane FROM samples WHERE id = $2) o
		WHERE s.id = o.id AND s.state = 1 AND s.lease_owner = $3 AND ($4 = 0 OR s.lease_token = $4)
		RETURNING s.partition, o.old_lane AS lane_from, 1::int2 AS state_from, s.lane, s.state`, "1")
	relaneSQL = movedSQL(`UPDATE samples s SET lane = $1
		FROM (SELECT id, lane AS old_lane FROM samples WHERE id = $2) o
		WHERE s.id = o.id AND s.state = 1 AND s.lease_owner = $3 AND ($4 = 0 OR s.lease_token = $4)
		RETURNING s.partition, o.old_lane AS lane_from, 1::int2 AS state_from, s.lane, s.state`, "1")
)

// commitBatch commits a batch in one transaction. A server-side error about
// one request's data fails the whole transaction, so then every request is
// retried in a transaction of its own and only the bad one fails.
func (s *Store) commitBatch(ctx context.Context, batch []store.Transition) []error {
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	err := s.commitTx(ctx, batch, errs)
	if err == nil {
		return errs
	}
	if !statementError(err) || len(batch) == 1 {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i := range batch {
		one := errs[i : i+1]
		if err := s.commitTx(ctx, batch[i:i+1], one); err != nil {
			one[0] = err
		}
	}
	return errs
}

// commitTx runs batch in one transaction, setting errs[i] to ErrNotLeased
// for each request whose lease is gone. A non-nil return means nothing was
// committed. The whole transaction, BEGIN to COMMIT, is one pipelined round
// trip.
func (s *Store) commitTx(ctx context.Context, batch []store.Transition, errs []error) error {
	clear(errs) // outcomes of an earlier, failed attempt do not carry over
	now := ns(s.now())
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	// Invariant 1: a result counts once it is durable, so this commit waits
	// for the WAL flush (the session default is asynchronous).
	b.Queue(`SET LOCAL synchronous_commit TO on`)
	// A sample listed twice (which a well-behaved caller never does) must
	// see the first request's effect: such requests go to later rounds.
	rest := make([]int, len(batch))
	for i := range rest {
		rest[i] = i
	}
	var rounds []queuedRound
	for len(rest) > 0 {
		round, later := splitUnique(batch, rest)
		rounds = append(rounds, queueRound(b, batch, round, now))
		rest = later
	}
	b.Queue(`COMMIT`)

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	res := conn.SendBatch(ctx, b)
	err = readCommit(res, batch, rounds, errs)
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {
		// The server skipped the COMMIT after the error; end the failed
		// transaction so the connection can serve again.
		_, _ = conn.Exec(ctx, `ROLLBACK`)
	}
	return err
}

// readCommit reads the results of commitTx's batch in order.
func readCommit(res pgx.BatchResults, batch []store.Transition, rounds []queuedRound, errs []error) error {
	for range 2 { // BEGIN, SET LOCAL
		if _, err := res.Exec(); err != nil {
			return err
		}
	}
	for _, r := range rounds {
		if err := r.read(res, batch, errs); err != nil {
			return err
		}
	}
	tag, err := res.Exec()
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" { // COMMIT of a failed transaction rolls back
		return fmt.Errorf("transaction not committed: %s", tag)
	}
	return nil
}

// splitUnique keeps the first request of each sample id in round and
// defers the rest.
func splitUnique(batch []store.Transition, idx []int) (round, later []int) {
	seen := make(map[string]bool, len(idx))
	for _, i := range idx {
		if seen[batch[i].ID] {
			later = append(later, i)
			continue
		}
		seen[batch[i].ID] = true
		round = append(round, i)
	}
	return round, later
}

// queuedRound is one round (distinct ids) queued in a batch: the finished
// samples in one statement, other transitions one statement each.
type queuedRound struct {
	single []int // requests with a statement each (turns among them), in queue order
	finish []int // requests in the finish statement (queued after single)
}

func queueRound(b *pgx.Batch, batch []store.Transition, round []int, now int64) queuedRound {
	var q queuedRound
	for _, i := range round {
		t := batch[i]
		switch t.Op {
		case store.OpFinish:
			q.finish = append(q.finish, i)
		case store.OpTurn:
			r := t.Result
			b.Queue(turnSQL, t.ID, t.Owner, int32(r.Turn), nonNil(r.Response), text(r.FinishReason), int32(r.PromptTokens),
				int32(r.CompletionTokens), int32(r.ReasoningTokens), text(r.Endpoint), int64(r.Duration), int64(r.TTFT), now, t.Lane,
				int32(r.Generation), t.Token)
			q.single = append(q.single, i)
		case store.OpRetry:
			b.Queue(retrySQL, ns(t.NotBefore), text(t.LastError), now, t.ID, t.Owner, t.Token)
			q.single = append(q.single, i)
		case store.OpDefer:
			b.Queue(deferSQL, ns(t.NotBefore), text(t.LastError), now, t.ID, t.Owner, t.Token)
			q.single = append(q.single, i)
		case store.OpDead:
			b.Queue(deadSQL, text(t.Reason), now, t.ID, t.Owner, t.Token)
			q.single = append(q.single, i)
		case store.OpEscalate:
			b.Queue(escalateSQL, t.Lane, t.ID, t.Owner, t.Token)
			q.single = append(q.single, i)
		case store.OpRelane:
			b.Queue(relaneSQL, t.Lane, t.ID, t.Owner, t.Token)
			q.single = append(q.single, i)
		}
	}
	if n := len(q.finish); n > 0 {
		var (
			ids, owners, reasons, endpoints, finishes = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			rules, endReasons                         = make([]string, n), make([]string, n)
			states                                    = make([]int16, n)
			responses                                 = make([][]byte, n)
			pts, cts, rts, turns, gens                = make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n)
			durs, ttfts, tokens                       = make([]int64, n), make([]int64, n), make([]int64, n)
		)
		for k, i := range q.finish {
			t := batch[i]
			r := t.Result
			ids[k], owners[k], states[k] = t.ID, t.Owner, stateCode(t.State)
			responses[k], finishes[k], pts[k], cts[k] = nonNil(r.Response), text(r.FinishReason), int32(r.PromptTokens), int32(r.CompletionTokens)
			endpoints[k], durs[k], ttfts[k], reasons[k] = text(r.Endpoint), int64(r.Duration), int64(r.TTFT), text(t.Evidence)
			rules[k], turns[k], rts[k], endReasons[k] = text(t.Rule), int32(r.Turn), int32(r.ReasoningTokens), text(r.EndReason)
			gens[k], tokens[k] = int32(r.Generation), t.Token
		}
		b.Queue(finishSQL, ids, owners, states, responses, finishes, pts, cts, endpoints, durs, ttfts, reasons, rules, turns, rts, endReasons, now, gens, tokens)
	}
	return q
}

// read takes the round's results off res, marking lost leases in errs.
func (q queuedRound) read(res pgx.BatchResults, batch []store.Transition, errs []error) error {
	for _, i := range q.single {
		if batch[i].Op == store.OpTurn {
			rows, err := res.Query()
			if err != nil {
				return err
			}
			outs, err := pgx.CollectRows(rows, scanOutcome)
			if err != nil {
				return err
			}
			errs[i] = outcomeErr(outs)
			continue
		}
		tag, err := res.Exec()
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			errs[i] = store.ErrNotLeased
		}
	}
	if len(q.finish) == 0 {
		return nil
	}
	rows, err := res.Query()
	if err != nil {
		return err
	}
	outs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idOutcome, error) {
		var o idOutcome
		err := row.Scan(&o.id, &o.ok, &o.turn)
		return o, err
	})
	if err != nil {
		return err
	}
	byID := make(map[string]outcome, len(outs))
	for _, o := range outs {
		byID[o.id] = o.outcome
	}
	for _, i := range q.finish {
		o, ok := byID[batch[i].ID]
		if !ok {
			errs[i] = store.ErrNotLeased
			continue
		}
		errs[i] = outcomeErr([]outcome{o})
	}
	return nil
}

// outcome is one row of finishSQL or turnSQL: done, or held at turn.
type outcome struct {
	ok   bool
	turn int32
}

type idOutcome struct {
	id string
	outcome
}

func scanOutcome(row pgx.CollectableRow) (outcome, error) {
	var o outcome
	err := row.Scan(&o.ok, &o.turn)
	return o, err
}

// outcomeErr maps a request's outcome rows to its error: none is a lost
// lease, a held sample at another turn is ErrWrongTurn.
func outcomeErr(outs []outcome) error {
	if len(outs) == 0 {
		return store.ErrNotLeased
	}
	if outs[0].ok {
		return nil
	}
	return fmt.Errorf("%w: the sample is at turn %d", store.ErrWrongTurn, outs[0].turn+1) // 1-based for people, as conversation.Ordinal
}
