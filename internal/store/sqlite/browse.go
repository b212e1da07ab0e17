package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// PutMinutes inserts or replaces history rows in one transaction.
func (s *Store) PutMinutes(ctx context.Context, ms []store.Minute) error {
	if len(ms) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for _, m := range ms {
			if _, err := tx.ExecContext(ctx, `INSERT INTO minutes
				(time, worker, endpoint, samples, tokens, requests, errors, in_flight, kv_usage, queued, running, lim)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (time, worker, endpoint) DO UPDATE SET samples = excluded.samples,
					tokens = excluded.tokens, requests = excluded.requests, errors = excluded.errors,
					in_flight = excluded.in_flight, kv_usage = excluded.kv_usage, queued = excluded.queued,
					running = excluded.running, lim = excluded.lim`,
				ns(m.Time), m.Worker, m.Endpoint, m.Samples, m.Tokens, m.Requests, m.Errors, m.InFlight,
				m.KVUsage, m.Queued, m.Running, m.Limit); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("put %d history rows: %w", len(ms), err)
	}
	return nil
}

// Minutes returns history rows from since on, oldest first.
func (s *Store) Minutes(ctx context.Context, since time.Time) ([]store.Minute, error) {
	rows, err := s.query(ctx, `SELECT time, worker, endpoint, samples, tokens, requests, errors, in_flight,
			kv_usage, queued, running, lim
		FROM minutes WHERE time >= ? ORDER BY time, worker, endpoint`, ns(since))
	if err != nil {
		return nil, fmt.Errorf("read history since %s: %w", since.Format(time.RFC3339), err)
	}
	defer rows.Close()
	var out []store.Minute
	for rows.Next() {
		var m store.Minute
		var t int64
		if err := rows.Scan(&t, &m.Worker, &m.Endpoint, &m.Samples, &m.Tokens, &m.Requests, &m.Errors, &m.InFlight,
			&m.KVUsage, &m.Queued, &m.Running, &m.Limit); err != nil {
			return nil, fmt.Errorf("read history: %w", err)
		}
		m.Time = fromNS(t)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	return out, nil
}

// Sample returns one sample with its last answer, if any, and the answers
// to its earlier turns.
func (s *Store) Sample(ctx context.Context, id string) (store.Row, bool, error) {
	var (
		r                         store.Row
		st, lastErr               string
		finishedAt                int64
		turn                      int
		response                  []byte
		finishReason              sql.NullString
		pt, ct, dur, ttft         sql.NullInt64
		resTurn, reasoning, gen   sql.NullInt64
		endpoint, rejection, rule sql.NullString
		endReason                 sql.NullString
	)
	q, err := s.stmt(ctx, `SELECT s.id, s.partition, s.lane, s.state, (SELECT body FROM sample_bodies b WHERE b.seq = s.seq), s.attempts,
			coalesce((SELECT prefix FROM origins WHERE id = s.origin_file), '') || s.origin_pos,
			coalesce(s.last_error, ''), coalesce(s.finished_at, 0), s.turn,
			r.response, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.endpoint,
			r.duration_ns, r.ttft_ns, r.reason, r.rule, r.turn, r.reasoning_tokens, r.end_reason, r.generation
		FROM samples s LEFT JOIN results r ON r.sample_id = s.id WHERE s.id = ?`)
	if err == nil {
		err = q.QueryRowContext(ctx, id).Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Body, &r.Attempts, &r.Origin,
			&lastErr, &finishedAt, &turn, &response, &finishReason, &pt, &ct, &endpoint, &dur, &ttft, &rejection, &rule,
			&resTurn, &reasoning, &endReason, &gen)
	}
	if err == sql.ErrNoRows {
		return store.Row{}, false, nil
	}
	if err != nil {
		return store.Row{}, false, fmt.Errorf("read sample %s: %w", id, err)
	}
	r.State = store.State(st)
	r.Body = unblob(r.Body)
	r.FinishedAt = fromNS(finishedAt)
	r.Reason = lastErr
	if finishReason.Valid {
		r.Result = store.Result{Response: unblob(response), FinishReason: finishReason.String,
			PromptTokens: int(pt.Int64), CompletionTokens: int(ct.Int64), Endpoint: endpoint.String,
			Duration: time.Duration(dur.Int64), TTFT: time.Duration(ttft.Int64),
			Turn: int(resTurn.Int64), ReasoningTokens: int(reasoning.Int64), EndReason: endReason.String,
			Generation: int(gen.Int64)}
		if r.State == store.Rejected {
			r.Reason, r.Rule = rejection.String, rule.String
		}
	}
	// The sample's turn is the one it is at (or finished on): every turn
	// before it has its stored answer, in progress or not.
	if turn > 0 {
		if r.Prior, err = s.priorTurns(ctx, id, turn); err != nil {
			return store.Row{}, false, fmt.Errorf("read sample %s: %w", id, err)
		}
	}
	return r, true, nil
}

// samplesQuery builds one of a handful of fixed query shapes (each
// prepared once) for q. States are written as literals so the planner can
// match the partial indexes that name them.
func samplesQuery(q store.SampleQuery) (string, []any, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = defaultSamplesLimit
	}
	from := "samples s"
	where := []string{"s.id > ?"}
	args := []any{q.After}
	switch q.State {
	case "":
	case store.Dead, store.Rejected:
		where = append(where, "s.state = '"+string(q.State)+"'")
	case store.Done:
		where = append(where, "s.state = 'done'", "s.finished_at IS NOT NULL")
	case store.Leased:
		// Bounded by concurrency: read them all and sort, never walk the ids.
		from = "samples s INDEXED BY samples_leased"
		where = append(where, "s.state = 'leased'")
	case store.Pending:
		where = append(where, "s.state = 'pending'")
	default:
		return "", nil, fmt.Errorf("unknown sample state %q", q.State)
	}
	if q.Partition != "" {
		where = append(where, "s.partition = ?")
		args = append(args, q.Partition)
	}
	args = append(args, limit)
	return `SELECT s.id, s.partition, s.lane, s.state, s.attempts,
			coalesce((SELECT prefix FROM origins WHERE id = s.origin_file), '') || s.origin_pos,
			coalesce(s.last_error, ''), coalesce(s.finished_at, 0),
			r.finish_reason, r.prompt_tokens, r.completion_tokens, r.endpoint, r.duration_ns, r.ttft_ns, r.reason,
			r.rule, r.turn, r.reasoning_tokens, r.end_reason, r.generation
		FROM ` + from + ` LEFT JOIN results r ON r.sample_id = s.id
		WHERE ` + strings.Join(where, " AND ") + ` ORDER BY s.id LIMIT ?`, args, nil
}

// defaultSamplesLimit bounds a Samples page when the caller names none.
const defaultSamplesLimit = 100

// Samples lists one page of samples. Each query shape is picked so an
// index serves it: the failed states have their own, a partition has its
// own, and the leased set is bounded by concurrency.
func (s *Store) Samples(ctx context.Context, q store.SampleQuery) ([]store.Row, error) {
	query, args, err := samplesQuery(q)
	if err != nil {
		return nil, fmt.Errorf("list samples: %w", err)
	}
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list samples %+v: %w", q, err)
	}
	defer rows.Close()
	var out []store.Row
	for rows.Next() {
		var (
			r                         store.Row
			st                        string
			finishedAt                int64
			finishReason              sql.NullString
			pt, ct, dur, ttft         sql.NullInt64
			resTurn, reasoning        sql.NullInt64
			endpoint, rejection, rule sql.NullString
			endReason                 sql.NullString
			generation                sql.NullInt64
		)
		if err := rows.Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Attempts, &r.Origin, &r.Reason, &finishedAt,
			&finishReason, &pt, &ct, &endpoint, &dur, &ttft, &rejection, &rule, &resTurn, &reasoning, &endReason, &generation); err != nil {
			return nil, fmt.Errorf("list samples: %w", err)
		}
		r.State = store.State(st)
		r.FinishedAt = fromNS(finishedAt)
		if finishReason.Valid {
			r.Result = store.Result{FinishReason: finishReason.String, PromptTokens: int(pt.Int64),
				CompletionTokens: int(ct.Int64), Endpoint: endpoint.String,
				Duration: time.Duration(dur.Int64), TTFT: time.Duration(ttft.Int64),
				Turn: int(resTurn.Int64), ReasoningTokens: int(reasoning.Int64), EndReason: endReason.String,
				Generation: int(generation.Int64)}
			if r.State == store.Rejected {
				r.Reason, r.Rule = rejection.String, rule.String
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list samples: %w", err)
	}
	return out, nil
}
