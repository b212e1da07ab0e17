package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// Dashboard history and the sample browser (regen watch, the web
// dashboard): read-only views apart from PutMinutes, which each worker
// calls once per heartbeat.

// putMinutesSQL upserts a batch sent as arrays. Rows are keyed by minute,
// worker and endpoint, so workers never write each other's rows; readers
// sum them.
const putMinutesSQL = `INSERT INTO minutes AS m
		(time, worker, endpoint, samples, tokens, requests, errors, in_flight, kv_usage, queued, running, lim)
	SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[],
		$8::int4[], $9::float8[], $10::float8[], $11::float8[], $12::int4[])
	ON CONFLICT (time, worker, endpoint) DO UPDATE SET samples = excluded.samples, tokens = excluded.tokens,
		requests = excluded.requests, errors = excluded.errors, in_flight = excluded.in_flight,
		kv_usage = excluded.kv_usage, queued = excluded.queued, running = excluded.running, lim = excluded.lim`

// PutMinutes inserts or replaces history rows in one statement.
func (s *Store) PutMinutes(ctx context.Context, ms []store.Minute) error {
	if len(ms) == 0 {
		return nil
	}
	// One statement may not update a row twice: the last row of a key wins,
	// as it would in a sequence of writes.
	at := make(map[[3]string]int, len(ms))
	var (
		times, samples, tokens, requests, errs []int64
		workers, endpoints                     []string
		inFlight, limits                       []int32
		kv, queued, running                    []float64
	)
	for _, m := range ms {
		key := [3]string{fmt.Sprint(ns(m.Time)), m.Worker, m.Endpoint}
		if i, ok := at[key]; ok {
			samples[i], tokens[i], requests[i], errs[i] = int64(m.Samples), m.Tokens, m.Requests, m.Errors
			inFlight[i], kv[i], queued[i], running[i], limits[i] = int32(m.InFlight), m.KVUsage, m.Queued, m.Running, int32(m.Limit)
			continue
		}
		at[key] = len(times)
		times, workers, endpoints = append(times, ns(m.Time)), append(workers, text(m.Worker)), append(endpoints, text(m.Endpoint))
		samples, tokens, requests, errs = append(samples, int64(m.Samples)), append(tokens, m.Tokens), append(requests, m.Requests), append(errs, m.Errors)
		inFlight, limits = append(inFlight, int32(m.InFlight)), append(limits, int32(m.Limit))
		kv, queued, running = append(kv, m.KVUsage), append(queued, m.Queued), append(running, m.Running)
	}
	_, err := s.pool.Exec(ctx, putMinutesSQL, times, workers, endpoints, samples, tokens, requests, errs,
		inFlight, kv, queued, running, limits)
	if err != nil {
		return fmt.Errorf("put %d history rows: %w", len(ms), err)
	}
	return nil
}

// Minutes returns history rows from since on, oldest first, then by worker
// and endpoint byte-wise (the primary key's order).
func (s *Store) Minutes(ctx context.Context, since time.Time) ([]store.Minute, error) {
	rows, err := s.pool.Query(ctx, `SELECT time, worker, endpoint, samples, tokens, requests, errors, in_flight,
			kv_usage, queued, running, lim
		FROM minutes WHERE time >= $1 ORDER BY time, worker, endpoint`, ns(since))
	if err != nil {
		return nil, fmt.Errorf("read history since %s: %w", since.Format(time.RFC3339), err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Minute, error) {
		var m store.Minute
		var t, samples int64
		var inFlight, limit int32
		err := row.Scan(&t, &m.Worker, &m.Endpoint, &samples, &m.Tokens, &m.Requests, &m.Errors, &inFlight,
			&m.KVUsage, &m.Queued, &m.Running, &limit)
		m.Time, m.Samples, m.InFlight, m.Limit = fromNS(t), int(samples), int(inFlight), int(limit)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("read history since %s: %w", since.Format(time.RFC3339), err)
	}
	return out, nil
}

// browseCols are a sample's columns and its last answer's, without the
// body and the response; Sample adds those.
const browseCols = `s.id, s.partition, s.lane, s.state, s.attempts, s.turn,
	coalesce((SELECT prefix FROM origins WHERE id = s.origin_file), '') || s.origin_pos,
	coalesce(s.last_error, ''), coalesce(s.finished_at, 0),
	r.finish_reason, r.prompt_tokens, r.completion_tokens, r.endpoint, r.duration_ns, r.ttft_ns,
	r.reason, r.rule, r.turn, r.reasoning_tokens, r.end_reason, r.generation`

// scanBrowse reads browseCols (then extra trailing columns) into a row; the
// turn the sample is at is returned beside it.
func scanBrowse(row pgx.Row, extra ...any) (store.Row, int, error) {
	var (
		r                 store.Row
		st                int16
		attempts, turn    int32
		finishedAt        int64
		finishReason      *string
		pt, ct, rTurn, rt *int32
		gen               *int32
		dur, ttft         *int64
		endpoint          *string
		reason, rule, end *string
	)
	dest := append([]any{&r.ID, &r.Partition, &r.Lane, &st, &attempts, &turn, &r.Origin, &r.Reason, &finishedAt,
		&finishReason, &pt, &ct, &endpoint, &dur, &ttft, &reason, &rule, &rTurn, &rt, &end, &gen}, extra...)
	if err := row.Scan(dest...); err != nil {
		return r, 0, err
	}
	r.State, r.Attempts, r.FinishedAt = stateName(st), int(attempts), fromNS(finishedAt)
	if finishReason != nil {
		r.Result = store.Result{FinishReason: *finishReason, PromptTokens: int(*pt), CompletionTokens: int(*ct),
			Endpoint: *endpoint, Duration: time.Duration(*dur), TTFT: time.Duration(*ttft), Turn: int(*rTurn),
			ReasoningTokens: int(*rt), EndReason: *end, Generation: int(*gen)}
		if r.State == store.Rejected {
			r.Reason, r.Rule = *reason, *rule
		}
	}
	return r, int(turn), nil
}

// Sample returns one sample with its body, its last answer, if any, and the
// answers to its earlier turns.
func (s *Store) Sample(ctx context.Context, id string) (store.Row, bool, error) {
	var body, response []byte
	r, turn, err := scanBrowse(s.pool.QueryRow(ctx, `SELECT `+browseCols+`, s.body, r.response
		FROM samples s LEFT JOIN results r ON r.sample_id = s.id WHERE s.id = $1`, id), &body, &response)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Row{}, false, nil
	}
	if err != nil {
		return store.Row{}, false, fmt.Errorf("read sample %s: %w", id, err)
	}
	r.Body, r.Result.Response = unblob(body), unblob(response)
	// The sample's turn is the one it is at (or finished on): every turn
	// before it has its stored answer, in progress or not.
	if turn > 0 {
		if r.Prior, err = s.priorTurns(ctx, id, turn); err != nil {
			return store.Row{}, false, fmt.Errorf("read sample %s: %w", id, err)
		}
	}
	return r, true, nil
}

// samplesQuery is the listing statement for q. State conditions are
// literals so the planner matches the partial indexes that name them: the
// failed states and the finished ones have their own, ordered by id, and
// the leased ones are bounded by concurrency. A partition alone walks the
// id index (an index on partition would cost every claim and completion an
// index entry, since PostgreSQL writes a new row version for each).
func samplesQuery(q store.SampleQuery) (string, []any, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = defaultSamplesLimit
	}
	where := []string{"s.id > $1"}
	args := []any{q.After, limit}
	switch q.State {
	case "":
	case store.Pending:
		where = append(where, "s.state = 0")
	case store.Leased:
		where = append(where, "s.state = 1")
	case store.Done:
		where = append(where, "s.state = 2", "s.finished_at IS NOT NULL")
	case store.Rejected:
		where = append(where, "s.state = 3")
	case store.Dead:
		where = append(where, "s.state = 4")
	default:
		return "", nil, fmt.Errorf("unknown sample state %q", q.State)
	}
	if q.Partition != "" {
		where = append(where, "s.partition = $3")
		args = append(args, q.Partition)
	}
	return `SELECT ` + browseCols + `
		FROM samples s LEFT JOIN results r ON r.sample_id = s.id
		WHERE ` + strings.Join(where, " AND ") + ` ORDER BY s.id LIMIT $2`, args, nil
}

// defaultSamplesLimit bounds a Samples page when the caller names none.
const defaultSamplesLimit = 100

// Samples lists one page of samples in id order.
func (s *Store) Samples(ctx context.Context, q store.SampleQuery) ([]store.Row, error) {
	query, args, err := samplesQuery(q)
	if err != nil {
		return nil, fmt.Errorf("list samples: %w", err)
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list samples %+v: %w", q, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Row, error) {
		r, _, err := scanBrowse(row)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("list samples %+v: %w", q, err)
	}
	return out, nil
}
