package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

const generationCols = `generation, fingerprint, config, served_model, started_at, requeued, superseded`

// Configure checks c against the current generation in one transaction
// under an advisory lock, so workers starting at once with different job
// files are judged one after the other: the first sets the configuration
// and the others compare with it.
func (s *Store) Configure(ctx context.Context, c store.Config, o store.ConfigureOptions) (store.Generation, error) {
	if c.Fingerprint == "" {
		return store.Generation{}, errors.New("configure: empty fingerprint")
	}
	now := o.Now
	if now.IsZero() {
		now = s.now()
	}
	var g store.Generation
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(s.schema, "regen:configure")); err != nil {
			return fmt.Errorf("lock configuration: %w", err)
		}
		cur, ok, err := currentGeneration(ctx, tx)
		if err != nil {
			return err
		}
		var record, requeue bool
		if g, record, requeue, err = store.NextGeneration(cur, ok, c, o, now); err != nil || !record {
			return err
		}
		if ok && g.N == cur.N {
			return replaceFingerprint(ctx, tx, g)
		}
		if requeue {
			if g.Requeued, err = requeueAll(ctx, tx, g.N, ns(now), o.Lanes); err != nil {
				return err
			}
			if err := holdForRebuild(ctx, tx, o.Rebuild); err != nil {
				return err
			}
		}
		return insertGeneration(ctx, tx, g)
	})
	if err != nil {
		return store.Generation{}, fmt.Errorf("configure: %w", err)
	}
	return g, nil
}

func currentGeneration(ctx context.Context, tx pgx.Tx) (store.Generation, bool, error) {
	g, err := scanGeneration(tx.QueryRow(ctx, `SELECT `+generationCols+` FROM generations ORDER BY generation DESC LIMIT 1`))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Generation{}, false, nil
	}
	if err != nil {
		return store.Generation{}, false, fmt.Errorf("read current generation: %w", err)
	}
	return g, true, nil
}

func scanGeneration(row pgx.Row) (store.Generation, error) {
	var g store.Generation
	var n int32
	var started, requeued, superseded int64
	if err := row.Scan(&n, &g.Fingerprint, &g.Config, &g.ServedModel, &started, &requeued, &superseded); err != nil {
		return g, err
	}
	g.N, g.Started, g.Requeued, g.Superseded = int(n), fromNS(started), int(requeued), int(superseded)
	return g, nil
}

func insertGeneration(ctx context.Context, tx pgx.Tx, g store.Generation) error {
	if _, err := tx.Exec(ctx, `INSERT INTO generations (`+generationCols+`) VALUES ($1, $2, $3, $4, $5, $6, 0)`,
		int32(g.N), g.Fingerprint, nonNil(g.Config), g.ServedModel, ns(g.Started), int64(g.Requeued)); err != nil {
		return fmt.Errorf("record generation %d: %w", g.N, err)
	}
	return nil
}

// replaceFingerprint records g's fingerprint as its generation's: the same
// configuration as an earlier regen fingerprinted it.
func replaceFingerprint(ctx context.Context, tx pgx.Tx, g store.Generation) error {
	if _, err := tx.Exec(ctx, `UPDATE generations SET fingerprint = $1, config = $2 WHERE generation = $3`,
		g.Fingerprint, nonNil(g.Config), int32(g.N)); err != nil {
		return fmt.Errorf("record generation %d's fingerprint: %w", g.N, err)
	}
	return nil
}

// holdForRebuild keeps the samples of partitions from claims until ingest
// rebuilds their bodies, and forgets what the old mapping made of their
// files (manifest entries, bad rows, duplicate ids), so ingest reads them
// again. Every sample is pending already (requeueAll), so no count moves.
func holdForRebuild(ctx context.Context, tx pgx.Tx, partitions []string) error {
	for _, p := range partitions {
		for _, q := range []string{
			`UPDATE samples SET not_before = -1 WHERE partition = $1`,
			`DELETE FROM source_files WHERE partition = $1`,
			`DELETE FROM ingest_errors WHERE partition = $1`,
			`DELETE FROM ingest_duplicates WHERE partition = $1`,
		} {
			if _, err := tx.Exec(ctx, q, text(p)); err != nil {
				return fmt.Errorf("rebuild partition %s: %w", p, err)
			}
		}
	}
	return nil
}

// requeueAll moves every stored answer and dead-letter reason into the
// history (superseded by generation next), returns every sample to pending
// at its first turn with no attempts spent, in the lane lanes gives it, and
// moves the counts and statistics with them.
func requeueAll(ctx context.Context, tx pgx.Tx, next int, now int64, lanes []store.LaneRange) (int, error) {
	steps := []struct {
		what, q string
		args    []any
	}{
		{"count superseded answers", `UPDATE generations g SET superseded = g.superseded + c.n FROM (
			SELECT generation, count(*) AS n FROM (SELECT generation FROM results UNION ALL SELECT generation FROM turns) x
			GROUP BY generation) c WHERE g.generation = c.generation`, nil},
		{"keep answers", `INSERT INTO answer_history SELECT r.sample_id, $1, r.turn, r.generation,
			CASE s.state WHEN 3 THEN 'rejected' ELSE 'done' END, r.partition, r.lane,
			r.response, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.reasoning_tokens, r.endpoint, r.duration_ns,
			r.ttft_ns, s.attempts, r.reason, r.rule, r.end_reason, r.finished_at
			FROM results r JOIN samples s ON s.id = r.sample_id`, []any{int32(next)}},
		{"keep earlier turns", `INSERT INTO answer_history SELECT sample_id, $1, turn, generation, 'turn', partition, lane,
			response, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, endpoint, duration_ns,
			ttft_ns, attempts, '', '', '', finished_at FROM turns`, []any{int32(next)}},
		{"keep dead letters", `INSERT INTO answer_history SELECT id, $1, turn, $1 - 1, 'dead', partition, lane,
			'\x'::bytea, '', 0, 0, 0, '', 0, 0, attempts, coalesce(last_error, ''), '', '', coalesce(finished_at, $2)
			FROM samples WHERE state = 4`, []any{int32(next), now}},
		{"drop answers", `WITH a AS (DELETE FROM results RETURNING ` + answerCols + `), ` +
			statsCTEs("a", -1, false) + ` SELECT count(*) FROM a`, nil},
		{"drop earlier turns", `WITH a AS (DELETE FROM turns RETURNING partition, lane, finish_reason, ''::text AS rule,
			reasoning_tokens, ''::text AS end_reason, prompt_tokens, completion_tokens, finished_at), ` +
			statsCTEs("a", -1, false) + ` SELECT count(*) FROM a`, nil},
	}
	for _, st := range steps {
		if _, err := tx.Exec(ctx, st.q, st.args...); err != nil {
			return 0, fmt.Errorf("%s: %w", st.what, err)
		}
	}
	tag, err := tx.Exec(ctx, movedSQL(`UPDATE samples s SET state = 0, turn = 0, attempts = 0, not_before = 0,
			finished_at = NULL, last_error = NULL, last_error_at = NULL, lease_owner = NULL, lease_until = NULL
		FROM (SELECT id, lane AS old_lane, state AS old_state FROM samples
			WHERE state <> 0 OR turn > 0 OR attempts > 0 OR not_before > 0 FOR UPDATE) o
		WHERE s.id = o.id
		RETURNING s.partition, o.old_lane AS lane_from, o.old_state AS state_from, s.lane, s.state`, "1"))
	if err != nil {
		return 0, fmt.Errorf("requeue samples: %w", err)
	}
	for _, l := range lanes {
		if _, err := tx.Exec(ctx, movedSQL(`UPDATE samples s SET lane = $1
			FROM (SELECT id, lane AS old_lane FROM samples
				WHERE partition = $2 AND prompt_tokens >= $3 AND ($4 = 0 OR prompt_tokens <= $4) AND lane <> $1 FOR UPDATE) o
			WHERE s.id = o.id
			RETURNING s.partition, o.old_lane AS lane_from, s.state AS state_from, s.lane, s.state`, "1"),
			l.Lane, l.Partition, int32(l.MinTokens), int32(l.MaxTokens)); err != nil {
			return 0, fmt.Errorf("assign %s to lane %s: %w", l.Partition, l.Lane, err)
		}
	}
	return int(tag.RowsAffected()), nil
}

// Generations returns every generation, oldest first; the current one
// counts the answers stored (the statistics' requests: every turn).
func (s *Store) Generations(ctx context.Context) ([]store.Generation, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+generationCols+` FROM generations ORDER BY generation`)
	if err != nil {
		return nil, fmt.Errorf("read generations: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Generation, error) { return scanGeneration(row) })
	if err != nil {
		return nil, fmt.Errorf("read generations: %w", err)
	}
	if len(out) > 0 {
		var n int64
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(requests), 0) FROM stat_cells`).Scan(&n); err != nil {
			return nil, fmt.Errorf("count answers: %w", err)
		}
		out[len(out)-1].Answers = int(n)
	}
	return out, nil
}

// SetServedModel records generation gen's served model unless one is.
func (s *Store) SetServedModel(ctx context.Context, gen int, model string) (string, error) {
	var got string
	err := s.pool.QueryRow(ctx, `WITH u AS (
			UPDATE generations SET served_model = $2 WHERE generation = $1 AND served_model = '' RETURNING served_model
		) SELECT served_model FROM u UNION ALL SELECT served_model FROM generations WHERE generation = $1 AND served_model <> ''`,
		int32(gen), model).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("record served model: no generation %d", gen)
	}
	if err != nil {
		return "", fmt.Errorf("record served model of generation %d: %w", gen, err)
	}
	return got, nil
}
