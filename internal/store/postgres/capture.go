package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/regen-dev/regen/internal/store"
)

// claimCaptureSQL creates the key's row leased, or takes a pending one or
// one whose lease ended, bumping the fencing token; no row comes back when
// the key is captured, dead or leased to a live lease. The upsert locks
// the row, so two workers claiming one key at once get it once.
const claimCaptureSQL = `INSERT INTO captures (key, sample_id, turn, state, owner, lease_until, token, input_sha256)
	VALUES ($1, $2, $3, 'leased', $4, $5, 1, $7)
	ON CONFLICT (key) DO UPDATE SET state = 'leased', owner = excluded.owner, lease_until = excluded.lease_until,
		token = captures.token + 1,
		attempts = CASE WHEN captures.state IN ('done', 'dead') THEN 0 ELSE captures.attempts END,
		last_error = CASE WHEN captures.state IN ('done', 'dead') THEN '' ELSE captures.last_error END,
		input_sha256 = CASE WHEN excluded.input_sha256 <> '' THEN excluded.input_sha256 ELSE captures.input_sha256 END
	WHERE captures.state = 'pending' OR (captures.state = 'leased' AND captures.lease_until < $6)
		OR (captures.state IN ('done', 'dead') AND captures.input_sha256 <> '' AND excluded.input_sha256 <> '' AND captures.input_sha256 <> excluded.input_sha256)
	RETURNING sample_id, turn, token, attempts, last_error, server_path`

// fenced is the condition every transition of a claimed capture takes;
// its parameters follow the statement's own n.
func fenced(n int) string {
	return fmt.Sprintf(` WHERE key = $%d AND state = 'leased' AND owner = $%d AND token = $%d`, n+1, n+2, n+3)
}

// ClaimCapture leases k to owner unless it is captured, dead or leased.
func (s *Store) ClaimCapture(ctx context.Context, k store.CaptureKey, owner string, lease time.Duration) (store.CaptureClaim, bool, error) {
	now := s.now()
	c := store.CaptureClaim{CaptureKey: k, Owner: owner, LeaseUntil: now.Add(lease)}
	err := s.pool.QueryRow(ctx, claimCaptureSQL, text(k.Key), text(k.SampleID), k.Turn, owner, ns(c.LeaseUntil), ns(now), k.Input).
		Scan(&c.SampleID, &c.Turn, &c.Token, &c.Attempts, &c.LastError, &c.ServerPath)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.CaptureClaim{}, false, nil
	}
	if err != nil {
		return store.CaptureClaim{}, false, fmt.Errorf("claim capture %s: %w", k.Key, err)
	}
	if c.ServerPath, err = s.ownServerPath(ctx, k.Key, c.ServerPath); err != nil {
		return store.CaptureClaim{}, false, err
	}
	return c, true, nil
}

// ownServerPath is path when no other key's row names it, else "": a
// path two keys were handed is neither's to remove.
func (s *Store) ownServerPath(ctx context.Context, key, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	var other bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM captures WHERE server_path = $1 AND key <> $2)`,
		text(path), text(key)).Scan(&other); err != nil {
		return "", fmt.Errorf("claim capture %s: read its server path: %w", key, err)
	}
	if other {
		return "", nil
	}
	return path, nil
}

// NoteCaptureServerPath records the server's file named for c's key; the
// commit waits for the WAL (the path must outlive a crash of the worker).
func (s *Store) NoteCaptureServerPath(ctx context.Context, c store.CaptureClaim, path string) error {
	var tag pgconn.CommandTag
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO on`); err != nil {
			return err
		}
		var err error
		tag, err = tx.Exec(ctx, `UPDATE captures SET server_path = $1`+fenced(1), text(path), text(c.Key), c.Owner, c.Token)
		return err
	})
	return settled(tag, err, "note capture server path", c.Key)
}

// ExtendCaptureLeases pushes owner's capture leases to now+lease.
func (s *Store) ExtendCaptureLeases(ctx context.Context, owner string, lease time.Duration) error {
	if _, err := s.pool.Exec(ctx, `UPDATE captures SET lease_until = $1 WHERE state = 'leased' AND owner = $2`,
		ns(s.now().Add(lease)), owner); err != nil {
		return fmt.Errorf("extend capture leases of %s: %w", owner, err)
	}
	return nil
}

// ConfirmCapture extends c's lease, or says it was lost.
func (s *Store) ConfirmCapture(ctx context.Context, c store.CaptureClaim, lease time.Duration) error {
	tag, err := s.pool.Exec(ctx, `UPDATE captures SET lease_until = $1`+fenced(1), ns(s.now().Add(lease)), text(c.Key), c.Owner, c.Token)
	return settled(tag, err, "confirm capture lease", c.Key)
}

// RecordCapture marks c's key captured with f, under c's lease; the
// commit waits for the WAL (a listed file is durable, invariant 1).
func (s *Store) RecordCapture(ctx context.Context, c store.CaptureClaim, f store.CapturedFile) error {
	at := f.CapturedAt
	if at.IsZero() {
		at = s.now()
	}
	var tag pgconn.CommandTag
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO on`); err != nil {
			return err
		}
		var err error
		tag, err = tx.Exec(ctx, `UPDATE captures SET state = 'done', owner = '', lease_until = 0, server_path = '',
			path = $1, bytes = $2, sha256 = $3, tokens = $4, layers = $5, hidden = $6, dtype = $7, captured_at = $8`+fenced(8),
			text(f.Path), f.Bytes, f.SHA256, f.Tokens, f.Layers, f.Hidden, f.DType, ns(at), text(c.Key), c.Owner, c.Token)
		return err
	})
	return settled(tag, err, "record capture", c.Key)
}

// FailCapture spends one attempt on c's key; dead ends its lease too.
func (s *Store) FailCapture(ctx context.Context, c store.CaptureClaim, evidence string, dead bool) error {
	q := `UPDATE captures SET attempts = attempts + 1, last_error = $1, server_path = ''` + fenced(1)
	if dead {
		q = `UPDATE captures SET attempts = attempts + 1, last_error = $1, server_path = '', state = 'dead', owner = '', lease_until = 0` + fenced(1)
	}
	tag, err := s.pool.Exec(ctx, q, text(evidence), text(c.Key), c.Owner, c.Token)
	return settled(tag, err, "fail capture", c.Key)
}

// ReleaseCapture returns c's key to pending; a lost lease is no error.
func (s *Store) ReleaseCapture(ctx context.Context, c store.CaptureClaim) error {
	if _, err := s.pool.Exec(ctx, `UPDATE captures SET state = 'pending', owner = '', lease_until = 0`+fenced(0),
		text(c.Key), c.Owner, c.Token); err != nil {
		return fmt.Errorf("release capture %s: %w", c.Key, err)
	}
	return nil
}

// ReleaseCaptures returns owner's (or, for "", every) leased capture to pending.
func (s *Store) ReleaseCaptures(ctx context.Context, owner string) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE captures SET state = 'pending', owner = '', lease_until = 0
		WHERE state = 'leased' AND ($1 = '' OR owner = $1)`, owner)
	if err != nil {
		return 0, fmt.Errorf("release captures of %q: %w", owner, err)
	}
	return int(tag.RowsAffected()), nil
}

// settled turns a fenced update's result into ErrNotLeased when it
// matched no row.
func settled(tag pgconn.CommandTag, err error, what, key string) error {
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s %s: %w", what, key, store.ErrNotLeased)
	}
	return nil
}

// CaptureStates returns the state and input of each listed key that has a row.
func (s *Store) CaptureStates(ctx context.Context, keys []string) (map[string]store.CaptureState, error) {
	out := make(map[string]store.CaptureState, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	sent := make([]string, len(keys))
	for i, k := range keys {
		sent[i] = text(k)
	}
	rows, err := s.pool.Query(ctx, `SELECT key, state, input_sha256 FROM captures WHERE key = ANY($1)`, sent)
	if err != nil {
		return nil, fmt.Errorf("read capture states: %w", err)
	}
	var k, st, in string
	_, err = pgx.ForEachRow(rows, []any{&k, &st, &in}, func() error {
		out[k] = store.CaptureState{State: store.State(st), Input: in}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read capture states: %w", err)
	}
	return out, nil
}

// CaptureCounts sums the captures per state.
func (s *Store) CaptureCounts(ctx context.Context) (store.CaptureCounts, error) {
	var c store.CaptureCounts
	rows, err := s.pool.Query(ctx, `SELECT state, count(*), coalesce(sum(bytes), 0)::bigint, coalesce(sum(tokens), 0)::bigint
		FROM captures GROUP BY state`)
	if err != nil {
		return c, fmt.Errorf("count captures: %w", err)
	}
	var st string
	var n int
	var bytes, tokens int64
	_, err = pgx.ForEachRow(rows, []any{&st, &n, &bytes, &tokens}, func() error {
		c.Add(store.State(st), n, bytes, tokens)
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("count captures: %w", err)
	}
	return c, nil
}

// EachCapturedFile calls fn for every captured file in key order, a page
// at a time.
func (s *Store) EachCapturedFile(ctx context.Context, fn func(store.CapturedFile) error) error {
	const page = 1000
	after := ""
	for {
		rows, err := s.pool.Query(ctx, `SELECT key, sample_id, turn, input_sha256, path, bytes, sha256, tokens, layers, hidden, dtype, captured_at
			FROM captures WHERE state = 'done' AND key > $1 ORDER BY key LIMIT $2`, after, page)
		if err != nil {
			return fmt.Errorf("list captured files: %w", err)
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.CapturedFile, error) {
			var f store.CapturedFile
			var at int64
			err := r.Scan(&f.Key, &f.SampleID, &f.Turn, &f.Input, &f.Path, &f.Bytes, &f.SHA256, &f.Tokens, &f.Layers, &f.Hidden, &f.DType, &at)
			f.CapturedAt = fromNS(at)
			return f, err
		})
		if err != nil {
			return fmt.Errorf("list captured files: %w", err)
		}
		for _, f := range batch {
			if err := fn(f); err != nil {
				return err
			}
		}
		if len(batch) < page {
			return nil
		}
		after = batch[len(batch)-1].Key
	}
}

// CaptureFailures lists keys whose own file failed, dead ones first.
func (s *Store) CaptureFailures(ctx context.Context, limit int) ([]store.CaptureFailure, error) {
	var lim any // NULL: no limit
	if limit > 0 {
		lim = limit
	}
	rows, err := s.pool.Query(ctx, `SELECT key, sample_id, turn, input_sha256, state, attempts, last_error FROM captures
		WHERE attempts > 0 AND state <> 'done' ORDER BY state <> 'dead', key LIMIT $1`, lim)
	if err != nil {
		return nil, fmt.Errorf("list capture failures: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.CaptureFailure, error) {
		var f store.CaptureFailure
		var st string
		err := r.Scan(&f.Key, &f.SampleID, &f.Turn, &f.Input, &st, &f.Attempts, &f.LastError)
		f.State = store.State(st)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("list capture failures: %w", err)
	}
	return out, nil
}

// RequeueDeadCaptures returns matching dead captures to pending with
// their attempts reset.
func (s *Store) RequeueDeadCaptures(ctx context.Context, reasonContains string) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE captures SET state = 'pending', attempts = 0
		WHERE state = 'dead' AND strpos(last_error, $1) > 0`, text(reasonContains))
	if err != nil {
		return 0, fmt.Errorf("requeue dead captures: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// RequeueCaptured returns a captured key to pending.
func (s *Store) RequeueCaptured(ctx context.Context, key, reason string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE captures SET state = 'pending', attempts = 0, last_error = $1 WHERE key = $2 AND state = 'done'`, text(reason), text(key))
	if err != nil {
		return false, fmt.Errorf("requeue capture %s: %w", key, err)
	}
	return tag.RowsAffected() > 0, nil
}

// leftServerPathsSQL lists the unleased rows' server paths no other row names.
const leftServerPathsSQL = `SELECT key, server_path FROM captures WHERE server_path <> '' AND state <> 'leased'
	AND server_path IN (SELECT server_path FROM captures WHERE server_path <> '' GROUP BY server_path HAVING count(*) = 1)`

// LeftServerPaths returns the server paths interrupted attempts left.
func (s *Store) LeftServerPaths(ctx context.Context) (map[string]string, error) {
	rows, err := s.pool.Query(ctx, leftServerPathsSQL)
	if err != nil {
		return nil, fmt.Errorf("read left server paths: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, p string
		if err := rows.Scan(&k, &p); err != nil {
			return nil, fmt.Errorf("read left server paths: %w", err)
		}
		out[k] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read left server paths: %w", err)
	}
	return out, nil
}

// ClearServerPath forgets key's server path if the row still names path.
func (s *Store) ClearServerPath(ctx context.Context, key, path string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE captures SET server_path = '' WHERE key = $1 AND server_path = $2 AND state <> 'leased'`,
		text(key), text(path)); err != nil {
		return fmt.Errorf("clear server path of capture %s: %w", key, err)
	}
	return nil
}
