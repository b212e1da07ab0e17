package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/regen-dev/regen/internal/store"
)

const generationCols = `generation, fingerprint, config, served_model, started_at, requeued, superseded`

// Configure checks c against the current generation in one write
// transaction (taken at BEGIN, so two processes configuring at once are
// serialised) and starts the next generation when asked.
func (s *Store) Configure(ctx context.Context, c store.Config, o store.ConfigureOptions) (store.Generation, error) {
	if c.Fingerprint == "" {
		return store.Generation{}, errors.New("configure: empty fingerprint")
	}
	now := o.Now
	if now.IsZero() {
		now = s.now()
	}
	var g store.Generation
	err := s.inTx(ctx, func(tx *sql.Tx) error {
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

func currentGeneration(ctx context.Context, tx *sql.Tx) (store.Generation, bool, error) {
	g, err := scanGeneration(tx.QueryRowContext(ctx, `SELECT `+generationCols+` FROM generations ORDER BY generation DESC LIMIT 1`))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Generation{}, false, nil
	}
	if err != nil {
		return store.Generation{}, false, fmt.Errorf("read current generation: %w", err)
	}
	return g, true, nil
}

func scanGeneration(sc interface{ Scan(...any) error }) (store.Generation, error) {
	var g store.Generation
	var started int64
	if err := sc.Scan(&g.N, &g.Fingerprint, &g.Config, &g.ServedModel, &started, &g.Requeued, &g.Superseded); err != nil {
		return g, err
	}
	g.Started = fromNS(started)
	return g, nil
}

func insertGeneration(ctx context.Context, tx *sql.Tx, g store.Generation) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO generations (`+generationCols+`) VALUES (?, ?, ?, ?, ?, ?, 0)`,
		g.N, g.Fingerprint, blob(g.Config), g.ServedModel, ns(g.Started), g.Requeued); err != nil {
		return fmt.Errorf("record generation %d: %w", g.N, err)
	}
	return nil
}

// replaceFingerprint records g's fingerprint as its generation's: the same
// configuration as an earlier regen fingerprinted it.
func replaceFingerprint(ctx context.Context, tx *sql.Tx, g store.Generation) error {
	if _, err := tx.ExecContext(ctx, `UPDATE generations SET fingerprint = ?, config = ? WHERE generation = ?`,
		g.Fingerprint, blob(g.Config), g.N); err != nil {
		return fmt.Errorf("record generation %d's fingerprint: %w", g.N, err)
	}
	return nil
}

// holdForRebuild keeps the samples of partitions from claims until ingest
// rebuilds their bodies, and forgets what the old mapping made of their
// files (manifest entries, bad rows, duplicate ids), so ingest reads them
// again.
func holdForRebuild(ctx context.Context, tx *sql.Tx, partitions []string) error {
	for _, p := range partitions {
		for _, q := range []string{
			`UPDATE samples SET not_before = -1 WHERE partition = ?`,
			`DELETE FROM source_files WHERE partition = ?`,
			`DELETE FROM ingest_errors WHERE partition = ?`,
			`DELETE FROM ingest_duplicates WHERE partition = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, p); err != nil {
				return fmt.Errorf("rebuild partition %s: %w", p, err)
			}
		}
	}
	return nil
}

// requeueAll moves every stored answer and dead-letter reason into the
// history (superseded by generation next) and returns every sample to
// pending at its first turn, with no attempts spent, in the lane lanes
// gives it. The triggers move the counts and statistics.
func requeueAll(ctx context.Context, tx *sql.Tx, next int, now int64, lanes []store.LaneRange) (int, error) {
	steps := []struct {
		what, q string
		args    []any
	}{
		{"count superseded answers", `UPDATE generations SET superseded = superseded + n FROM (
			SELECT generation AS g, count(*) AS n FROM (SELECT generation FROM results UNION ALL SELECT generation FROM turns)
			GROUP BY generation) WHERE generations.generation = g`, nil},
		{"keep answers", `INSERT INTO answer_history SELECT r.sample_id, ?1, r.turn, r.generation, s.state, r.partition, r.lane,
			r.response, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.reasoning_tokens, r.endpoint, r.duration_ns,
			r.ttft_ns, s.attempts, r.reason, r.rule, r.end_reason, r.finished_at
			FROM results r JOIN samples s ON s.id = r.sample_id`, []any{next}},
		{"keep earlier turns", `INSERT INTO answer_history SELECT sample_id, ?1, turn, generation, 'turn', partition, lane,
			response, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, endpoint, duration_ns,
			ttft_ns, attempts, '', '', '', finished_at FROM turns`, []any{next}},
		{"keep dead letters", `INSERT INTO answer_history SELECT id, ?1, turn, ?1 - 1, 'dead', partition, lane,
			x'', '', 0, 0, 0, '', 0, 0, attempts, coalesce(last_error, ''), '', '', coalesce(finished_at, ?2)
			FROM samples WHERE state = 'dead'`, []any{next, now}},
		{"drop answers", `DELETE FROM results`, nil},
		{"drop earlier turns", `DELETE FROM turns`, nil},
	}
	for _, st := range steps {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return 0, fmt.Errorf("%s: %w", st.what, err)
		}
	}
	res, err := tx.ExecContext(ctx, `UPDATE samples SET state = 'pending', turn = 0, attempts = 0, not_before = 0,
		finished_at = NULL, last_error = NULL, last_error_at = NULL, lease_owner = NULL, lease_until = NULL
		WHERE state <> 'pending' OR turn > 0 OR attempts > 0 OR not_before > 0`)
	if err != nil {
		return 0, fmt.Errorf("requeue samples: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("requeue samples: %w", err)
	}
	for _, l := range lanes {
		if _, err := tx.ExecContext(ctx, `UPDATE samples SET lane = ?1
			WHERE partition = ?2 AND prompt_tokens >= ?3 AND (?4 = 0 OR prompt_tokens <= ?4) AND lane <> ?1`,
			l.Lane, l.Partition, l.MinTokens, l.MaxTokens); err != nil {
			return 0, fmt.Errorf("assign %s to lane %s: %w", l.Partition, l.Lane, err)
		}
	}
	return int(n), nil
}

// Generations returns every generation, oldest first; the current one
// counts the answers stored (the statistics' requests: every turn).
func (s *Store) Generations(ctx context.Context) ([]store.Generation, error) {
	rows, err := s.query(ctx, `SELECT `+generationCols+` FROM generations ORDER BY generation`)
	if err != nil {
		return nil, fmt.Errorf("read generations: %w", err)
	}
	defer rows.Close()
	var out []store.Generation
	for rows.Next() {
		g, err := scanGeneration(rows)
		if err != nil {
			return nil, fmt.Errorf("read generations: %w", err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read generations: %w", err)
	}
	rows.Close()
	if len(out) > 0 {
		st, err := s.stmt(ctx, `SELECT coalesce(sum(requests), 0) FROM stat_cells`)
		if err == nil {
			err = st.QueryRowContext(ctx).Scan(&out[len(out)-1].Answers)
		}
		if err != nil {
			return nil, fmt.Errorf("count answers: %w", err)
		}
	}
	return out, nil
}

// SetServedModel records generation gen's served model unless one is.
func (s *Store) SetServedModel(ctx context.Context, gen int, model string) (string, error) {
	var got string
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET served_model = ? WHERE generation = ? AND served_model = ''`, model, gen); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT served_model FROM generations WHERE generation = ?`, gen).Scan(&got)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("record served model: no generation %d", gen)
	}
	if err != nil {
		return "", fmt.Errorf("record served model of generation %d: %w", gen, err)
	}
	return got, nil
}
