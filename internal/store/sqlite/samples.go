package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// Statements run inside write transactions. They are prepared at Open:
// preparing one needs the single connection, which the transaction holds.
const (
	insertSampleSQL = `INSERT INTO samples
			(id, partition, lane, prompt_tokens, origin_file, origin_pos, state)
			VALUES (?, ?, ?, ?, ?, ?, 'pending')
			ON CONFLICT (id) DO NOTHING`
	insertBodySQL = `INSERT INTO sample_bodies (seq, body) VALUES (?, ?)`
	// A row whose id another row already took does not become a sample; it
	// is recorded, once per origin (re-reading the same row is no duplicate).
	duplicateSQL = `INSERT OR IGNORE INTO ingest_duplicates (origin, id, partition, first_origin, same_content, created_at)
			SELECT ?, s.id, ?, (SELECT prefix FROM origins WHERE id = s.origin_file) || s.origin_pos, b.body = ?, ?
			FROM samples s JOIN sample_bodies b ON b.seq = s.seq
			WHERE s.id = ? AND (s.origin_file <> ? OR s.origin_pos <> ?)`
	// A sample held back for rebuilding takes the body its row maps to now;
	// the lane trigger moves its count.
	rebuildSampleSQL = `UPDATE samples
			SET prompt_tokens = ?, lane = ?, origin_file = ?, origin_pos = ?, not_before = 0
			WHERE id = ? AND not_before < 0
			RETURNING seq`
	rebuildBodySQL = `UPDATE sample_bodies SET body = ? WHERE seq = ?`
	// Ingest counts what it inserted once per batch (no per-row trigger).
	countPendingSQL = `INSERT INTO counts (partition, lane, state, n) VALUES (?, ?, 'pending', ?)
			ON CONFLICT (partition, lane, state) DO UPDATE SET n = n + excluded.n`
	insertIngestErrorSQL = `INSERT INTO ingest_errors
			(origin, partition, field, reason, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (origin, partition) DO NOTHING`
	// The result is inserted only if the caller holds the sample at the
	// result's turn; the sample row is updated after, in the same transaction.
	insertResultSQL = `INSERT INTO results
			(sample_id, response, finish_reason, prompt_tokens, completion_tokens, endpoint, duration_ns, ttft_ns, reason, finished_at,
			 turn, partition, lane, reasoning_tokens, rule, end_reason, generation)
			SELECT id, ?, ?, ?, ?, ?, ?, ?, ?, ?, turn, partition, lane, ?, ?, ?, ?
			FROM samples WHERE id = ? AND state = 'leased' AND lease_owner = ? AND turn = ?`
	finishSQL = `UPDATE samples
			SET state = ?, attempts = attempts + 1, finished_at = ?, lease_owner = NULL, lease_until = NULL
			WHERE id = ?`
	insertTurnSQL = `INSERT INTO turns
			(sample_id, turn, partition, lane, response, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens,
			 endpoint, duration_ns, ttft_ns, attempts, finished_at, generation)
			SELECT id, turn, partition, lane, ?, ?, ?, ?, ?, ?, ?, ?, attempts + 1, ?, ?
			FROM samples WHERE id = ? AND state = 'leased' AND lease_owner = ? AND turn = ?`
	nextTurnSQL = `UPDATE samples
			SET state = 'pending', turn = turn + 1, attempts = 0, not_before = 0,
				lane = CASE WHEN ? = '' THEN lane ELSE ? END, lease_owner = NULL, lease_until = NULL
			WHERE id = ?`
	heldTurnSQL = `SELECT turn FROM samples WHERE id = ? AND state = 'leased' AND lease_owner = ?`
	releaseSQL  = `UPDATE samples
			SET state = 'pending', lease_owner = NULL, lease_until = NULL
			WHERE id = ? AND state = 'leased' AND lease_owner = ?`
	retrySQL = `UPDATE samples
			SET state = 'pending', attempts = attempts + 1, not_before = ?,
				last_error = ?, last_error_at = ?, lease_owner = NULL, lease_until = NULL
			WHERE id = ? AND state = 'leased' AND lease_owner = ?`
	deferSQL = `UPDATE samples
			SET state = 'pending', not_before = ?,
				last_error = ?, last_error_at = ?, lease_owner = NULL, lease_until = NULL
			WHERE id = ? AND state = 'leased' AND lease_owner = ?`
	deadSQL = `UPDATE samples
			SET state = 'dead', attempts = attempts + 1, last_error = ?, last_error_at = ?,
				finished_at = ?, lease_owner = NULL, lease_until = NULL
			WHERE id = ? AND state = 'leased' AND lease_owner = ?`
	escalateSQL = `UPDATE samples
			SET state = 'pending', lane = ?, lease_owner = NULL, lease_until = NULL
			WHERE id = ? AND state = 'leased' AND lease_owner = ?`
	relaneSQL = `UPDATE samples SET lane = ? WHERE id = ? AND state = 'leased' AND lease_owner = ?`
)

// txQueries lists them for Open.
var txQueries = []string{insertSampleSQL, insertBodySQL, duplicateSQL, rebuildSampleSQL, rebuildBodySQL, countPendingSQL, insertIngestErrorSQL, finishSQL, insertResultSQL, releaseSQL,
	insertTurnSQL, nextTurnSQL, heldTurnSQL, retrySQL, deferSQL, deadSQL, escalateSQL, relaneSQL}

// Ingest inserts the samples whose ID is new, and counts them, all in one
// transaction.
func (s *Store) Ingest(ctx context.Context, samples []store.NewSample) (int, error) {
	if len(samples) == 0 {
		return 0, nil
	}
	for i, smp := range samples {
		if smp.ID == "" {
			return 0, fmt.Errorf("ingest: sample %d (%s) has an empty id", i, smp.Origin)
		}
	}
	files, err := s.originFiles(ctx, samples)
	if err != nil {
		return 0, fmt.Errorf("ingest %d samples: %w", len(samples), err)
	}
	type cell struct{ partition, lane string }
	inserted := 0
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		st, err := s.txStmt(ctx, tx, insertSampleSQL)
		if err != nil {
			return err
		}
		defer st.Close()
		var stale bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM samples WHERE not_before < 0)`).Scan(&stale); err != nil {
			return fmt.Errorf("look for samples to rebuild: %w", err)
		}
		added := map[cell]int{}
		for i, smp := range samples {
			n, err := s.ingestOne(ctx, tx, st, smp, files[i], stale)
			if err != nil {
				return fmt.Errorf("sample %s: %w", smp.ID, err)
			}
			inserted += n
			added[cell{smp.Partition, smp.Lane}] += n
		}
		for c, n := range added {
			if n == 0 {
				continue
			}
			if _, err := s.exec(ctx, tx, countPendingSQL, c.partition, c.lane, n); err != nil {
				return fmt.Errorf("count %s/%s: %w", c.partition, c.lane, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("ingest %d samples: %w", len(samples), err)
	}
	return inserted, nil
}

// ingestOne inserts one sample and its body and returns 1, or returns 0
// for an id already taken: a different row's is recorded as a duplicate,
// and a sample held back for rebuilding takes this row's body.
func (s *Store) ingestOne(ctx context.Context, tx *sql.Tx, insert *sql.Stmt, smp store.NewSample, file int64, stale bool) (int, error) {
	_, pos := store.SplitOrigin(smp.Origin)
	res, err := insert.ExecContext(ctx, smp.ID, smp.Partition, smp.Lane, smp.PromptTokens, file, pos)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if n == 1 {
		seq, err := res.LastInsertId()
		if err != nil {
			return 0, err
		}
		if _, err := s.exec(ctx, tx, insertBodySQL, seq, blob(smp.Body)); err != nil {
			return 0, fmt.Errorf("store body: %w", err)
		}
		return 1, nil
	}
	if _, err := s.exec(ctx, tx, duplicateSQL, smp.Origin, smp.Partition, blob(smp.Body), ns(s.now()), smp.ID, file, pos); err != nil {
		return 0, fmt.Errorf("record duplicate id: %w", err)
	}
	if !stale {
		return 0, nil
	}
	return 0, s.rebuild(ctx, tx, smp, file, pos)
}

// rebuild gives a sample held back for rebuilding (if smp's is) the lane
// and body its row maps to now.
func (s *Store) rebuild(ctx context.Context, tx *sql.Tx, smp store.NewSample, file int64, pos string) error {
	st, err := s.txStmt(ctx, tx, rebuildSampleSQL)
	if err != nil {
		return err
	}
	var seq int64
	err = st.QueryRowContext(ctx, smp.PromptTokens, smp.Lane, file, pos, smp.ID).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	res, err := s.exec(ctx, tx, rebuildBodySQL, blob(smp.Body), seq)
	if err != nil {
		return fmt.Errorf("rebuild body: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("rebuild body of sample %s: %d rows changed (%v), want 1: the store is damaged (sample_bodies lacks seq %d)", smp.ID, n, err, seq)
	}
	return nil
}

// originFiles returns the origins-table id of each sample's file part,
// adding new ones in a transaction of their own: ids enter the cache only
// once committed, so no sample ever points at a row a rollback removed.
func (s *Store) originFiles(ctx context.Context, samples []store.NewSample) ([]int64, error) {
	ids := make([]int64, len(samples))
	var missing []string
	s.mu.Lock()
	for i, smp := range samples {
		prefix, _ := store.SplitOrigin(smp.Origin)
		id, ok := s.origins[prefix]
		if !ok {
			missing = append(missing, prefix)
		}
		ids[i] = id
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return ids, nil
	}
	found := map[string]int64{}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for _, p := range missing {
			if _, ok := found[p]; ok {
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO origins (prefix) VALUES (?) ON CONFLICT (prefix) DO NOTHING`, p); err != nil {
				return err
			}
			var id int64
			if err := tx.QueryRowContext(ctx, `SELECT id FROM origins WHERE prefix = ?`, p).Scan(&id); err != nil {
				return err
			}
			found[p] = id
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record origin files: %w", err)
	}
	s.mu.Lock()
	maps.Copy(s.origins, found)
	for i, smp := range samples {
		prefix, _ := store.SplitOrigin(smp.Origin)
		ids[i] = s.origins[prefix]
	}
	s.mu.Unlock()
	return ids, nil
}

// AddIngestErrors records bad rows, ignoring origins already recorded.
func (s *Store) AddIngestErrors(ctx context.Context, errs []store.IngestError) error {
	if len(errs) == 0 {
		return nil
	}
	now := ns(s.now())
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		st, err := s.txStmt(ctx, tx, insertIngestErrorSQL)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, e := range errs {
			if _, err := st.ExecContext(ctx, e.Origin, e.Partition, e.Field, e.Reason, now); err != nil {
				return fmt.Errorf("origin %s: %w", e.Origin, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add %d ingest errors: %w", len(errs), err)
	}
	return nil
}

// DropStale deletes partition's samples still held back for rebuilding;
// the delete trigger moves the counts.
func (s *Store) DropStale(ctx context.Context, partition string) (int, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM samples WHERE partition = ? AND not_before < 0 AND state = 'pending'`, partition)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("drop samples of %s left from an earlier mapping: %w", partition, err)
	}
	return int(n), nil
}

// ForgetIngestErrors drops partition's bad rows recorded for file: its
// origins "file:..." sort between file+":" and file+";" (':' + 1), a range
// of the origin index.
func (s *Store) ForgetIngestErrors(ctx context.Context, partition, file string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM ingest_errors WHERE origin >= ? AND origin < ? AND partition = ?`,
			file+":", file+";", partition)
		return err
	})
	if err != nil {
		return fmt.Errorf("forget bad rows of %s in %s: %w", file, partition, err)
	}
	return nil
}

// IngestErrors returns recorded bad rows in the order they were first seen,
// at most limit of them (all when limit <= 0).
func (s *Store) IngestErrors(ctx context.Context, limit int) ([]store.IngestError, error) {
	rows, err := s.query(ctx, `SELECT partition, origin, field, reason
		FROM ingest_errors ORDER BY seq LIMIT ?`, sqlLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("read ingest errors: %w", err)
	}
	defer rows.Close()
	var out []store.IngestError
	for rows.Next() {
		var e store.IngestError
		if err := rows.Scan(&e.Partition, &e.Origin, &e.Field, &e.Reason); err != nil {
			return nil, fmt.Errorf("read ingest errors: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read ingest errors: %w", err)
	}
	return out, nil
}

// ingestErrorPage bounds one EachIngestError query, for the same reason as
// finishedPage: memory and a writer's wait stay at one page.
const ingestErrorPage = 1000

// Pages walk the primary key: the order rows were first recorded, which is
// source order (ingest reads files in order, lines in order).
const nextIngestErrorsSQL = `SELECT seq, partition, origin, field, reason
		FROM ingest_errors WHERE seq > ? ORDER BY seq LIMIT ?`

// IngestErrorCount counts recorded bad rows. SQLite answers count(*) from
// the smallest index, so it reads pages but holds no rows in memory.
func (s *Store) IngestErrorCount(ctx context.Context) (int, error) {
	var n int
	st, err := s.stmt(ctx, `SELECT count(*) FROM ingest_errors`)
	if err == nil {
		err = st.QueryRowContext(ctx).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("count ingest errors: %w", err)
	}
	return n, nil
}

// EachIngestError calls fn for every bad row in the order first recorded,
// a page at a time, holding no connection while fn runs.
func (s *Store) EachIngestError(ctx context.Context, fn func(store.IngestError) error) error {
	return store.EachPage(ingestErrorPage, func(after int64) ([]store.IngestError, int64, error) {
		page, last, err := s.ingestErrorPage(ctx, after)
		if err != nil {
			return nil, 0, fmt.Errorf("read ingest errors after #%d: %w", after, err)
		}
		return page, last, nil
	}, fn)
}

// ingestErrorPage returns the page after seq and the seq of its last row.
func (s *Store) ingestErrorPage(ctx context.Context, after int64) ([]store.IngestError, int64, error) {
	rows, err := s.query(ctx, nextIngestErrorsSQL, after, ingestErrorPage)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	out := make([]store.IngestError, 0, ingestErrorPage)
	var last int64
	for rows.Next() {
		var e store.IngestError
		if err := rows.Scan(&last, &e.Partition, &e.Origin, &e.Field, &e.Reason); err != nil {
			return nil, 0, err
		}
		out = append(out, e)
	}
	return out, last, rows.Err()
}

// sqlLimit maps "no limit" (<= 0) to SQLite's -1.
func sqlLimit(limit int) int {
	if limit <= 0 {
		return -1
	}
	return limit
}

// claimSQL leases n due samples of a lane: conversations waiting for their
// next turn first (their prefix is still cached at the server that
// answered the turn before), then the oldest. Due samples come from three
// partial indexes (see the schema): later turns never told to wait, every
// sample never told to wait, and those whose retry time has come. Each side
// is already in seq order and holds the best n of its kind, so the merge,
// by (first turn, seq) and without the rows two sides share, is the best n.
// The limits are +:n, not :n: SQLite plans with a bare LIMIT parameter's
// value and compiles the statement again whenever it changes, which n does
// with the dispatcher's free slots (TestClaimsDoNotRecompile).
const claimSQL = `UPDATE samples
		SET state = 'leased', lease_owner = :owner, lease_until = :until, not_before = 0
		WHERE seq IN (
			SELECT seq FROM (
				SELECT seq, 0 AS fresh FROM (
					SELECT seq FROM samples
					WHERE state = 'pending' AND lane = :lane AND not_before = 0 AND turn > 0
					ORDER BY seq LIMIT +:n)
				UNION ALL
				SELECT seq, fresh FROM (
					SELECT seq, turn = 0 AS fresh FROM samples
					WHERE state = 'pending' AND lane = :lane AND not_before = 0
					ORDER BY seq LIMIT +:n)
				UNION ALL
				SELECT seq, fresh FROM (
					SELECT seq, turn = 0 AS fresh FROM samples
					WHERE state = 'pending' AND lane = :lane AND not_before > 0 AND not_before <= :now
					ORDER BY seq LIMIT +:n))
			GROUP BY seq ORDER BY min(fresh), seq LIMIT +:n)
		RETURNING seq, id, partition, lane, ` + claimBody + `, prompt_tokens, attempts, turn, 0`

// claimKeptSQL is claimSQL that leaves out the body of a later turn the
// caller keeps (:kept, a JSON array of "turn:id"), and says so; the
// subquery is run once per claim, not per row.
var claimKeptSQL = strings.Replace(claimSQL, `, `+claimBody+`, prompt_tokens, attempts, turn, 0`,
	`, CASE WHEN `+keptTurn+` THEN NULL ELSE `+claimBody+` END, prompt_tokens, attempts, turn, `+keptTurn, 1)

const (
	claimBody = `(SELECT body FROM sample_bodies b WHERE b.seq = samples.seq)`
	keptTurn  = `(turn > 0 AND turn || ':' || id IN (SELECT value FROM json_each(:kept)))`
)

// Claim leases up to n claimable samples of lane, later turns first, then oldest first.
func (s *Store) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	return s.ClaimKept(ctx, lane, n, owner, lease, nil)
}

// ClaimKept is Claim that leaves out what the caller keeps (store.Queue).
// SQLite keeps no lease tokens: the turn alone decides, which is enough
// because a store file has one runner at a time (the runner lock), and a
// new generation starts only in a runner's configure, before it claims.
func (s *Store) ClaimKept(ctx context.Context, lane string, n int, owner string, lease time.Duration, kept []store.Kept) ([]store.Claimed, error) {
	if n <= 0 {
		return nil, nil
	}
	if owner == "" {
		return nil, fmt.Errorf("claim lane %s: empty owner", lane)
	}
	now := s.now()
	until := now.Add(lease)
	q, args := claimSQL, []any{sql.Named("owner", owner), sql.Named("until", ns(until)), sql.Named("lane", lane),
		sql.Named("now", ns(now)), sql.Named("n", n)}
	if len(kept) > 0 {
		q, args = claimKeptSQL, append(args, sql.Named("kept", keptKeys(kept)))
	}
	// One statement, so it is its own transaction; SQLite's single writer
	// means no two claimers can pick the same row.
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", lane, err)
	}
	defer rows.Close()
	var out []store.Claimed
	for rows.Next() {
		var c store.Claimed
		var body blobColumn // not valid only when the body row is missing or kept
		if err := rows.Scan(&c.Seq, &c.ID, &c.Partition, &c.Lane, &body, &c.PromptTokens, &c.Attempts, &c.Turn, &c.Kept); err != nil {
			return nil, fmt.Errorf("claim lane %s: %w", lane, err)
		}
		if !body.valid && !c.Kept {
			return nil, fmt.Errorf("claim lane %s: sample %s has no body (sample_bodies lacks seq %d): the store is damaged", lane, c.ID, c.Seq)
		}
		c.Body = unblob(body.b)
		c.LeaseUntil = fromNS(ns(until))
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", lane, err)
	}
	// RETURNING order is unspecified; hand them out in claim order.
	slices.SortFunc(out, store.ClaimOrder)
	rows.Close()
	for i := range out {
		c := &out[i]
		if c.Turn > 0 && !c.Kept {
			// Stored turns never change, so reading them after the claim
			// is safe: the lease keeps anyone else from adding one.
			if c.Prior, err = s.priorTurns(ctx, c.ID, c.Turn); err != nil {
				return nil, fmt.Errorf("claim lane %s: sample %s: %w", lane, c.ID, err)
			}
		}
	}
	return out, nil
}

// keptKeys is kept as claimKeptSQL's :kept.
func keptKeys(kept []store.Kept) string {
	keys := make([]string, len(kept))
	for i, k := range kept {
		keys[i] = strconv.Itoa(k.Turn) + ":" + k.ID
	}
	b, _ := json.Marshal(keys) // strings always encode
	return string(b)
}

const priorTurnsSQL = `SELECT turn, lane, response, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens,
		endpoint, duration_ns, ttft_ns, attempts, generation
	FROM turns WHERE sample_id = ? AND turn < ? ORDER BY turn`

// priorTurns reads the stored answers to turns 0..upTo-1 of a sample.
func (s *Store) priorTurns(ctx context.Context, id string, upTo int) ([]store.Result, error) {
	rows, err := s.query(ctx, priorTurnsSQL, id, upTo)
	if err != nil {
		return nil, fmt.Errorf("read earlier turns: %w", err)
	}
	defer rows.Close()
	out := make([]store.Result, 0, upTo)
	for rows.Next() {
		r, err := scanTurn(rows)
		if err != nil {
			return nil, fmt.Errorf("read earlier turns: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read earlier turns: %w", err)
	}
	if len(out) != upTo {
		return nil, fmt.Errorf("read earlier turns: %d stored, want %d", len(out), upTo)
	}
	return out, nil
}

// scanTurn reads the columns of priorTurnsSQL.
func scanTurn(rows interface{ Scan(...any) error }, extra ...any) (store.Result, error) {
	var r store.Result
	var dur, ttft int64
	var response blobColumn
	dest := append(extra, &r.Turn, &r.Lane, &response, &r.FinishReason, &r.PromptTokens, &r.CompletionTokens, &r.ReasoningTokens,
		&r.Endpoint, &dur, &ttft, &r.Attempts, &r.Generation)
	if err := rows.Scan(dest...); err != nil {
		return r, err
	}
	r.Response, r.Duration, r.TTFT = unblob(response.b), time.Duration(dur), time.Duration(ttft)
	return r, nil
}

// ExtendLeases pushes every lease owner holds to now+lease.
func (s *Store) ExtendLeases(ctx context.Context, owner string, lease time.Duration) error {
	until := ns(s.now().Add(lease))
	if _, err := s.exec(ctx, nil, `UPDATE samples SET lease_until = ?
		WHERE state = 'leased' AND lease_owner = ?`, until, owner); err != nil {
		return fmt.Errorf("extend leases of %s: %w", owner, err)
	}
	return nil
}

// heldAt turns an INSERT guarded by lease and turn that matched nothing
// into ErrNotLeased, or ErrWrongTurn when the lease is held.
func (s *Store) heldAt(ctx context.Context, tx *sql.Tx, res sql.Result, err error, id, owner string) error {
	err = held(res, err)
	if !errors.Is(err, store.ErrNotLeased) {
		return err
	}
	st, serr := s.txStmt(ctx, tx, heldTurnSQL)
	if serr != nil {
		return serr
	}
	var turn int
	switch serr := st.QueryRowContext(ctx, id, owner).Scan(&turn); {
	case errors.Is(serr, sql.ErrNoRows):
		return store.ErrNotLeased
	case serr != nil:
		return serr
	}
	return fmt.Errorf("%w: the sample is at turn %d", store.ErrWrongTurn, turn+1) // 1-based for people, as conversation.Ordinal
}

// held turns an UPDATE guarded by the lease into ErrNotLeased when it
// matched nothing.
func held(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotLeased
	}
	return nil
}

// RequeueRejected returns rejected samples (of rule, "" = all) to pending
// at the rejected turn with attempts reset, dropping the rejected answers.
func (s *Store) RequeueRejected(ctx context.Context, rule string) (int, error) {
	n := 0
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE samples
			SET state = 'pending', attempts = 0, not_before = 0, finished_at = NULL
			WHERE state = 'rejected' AND id IN (SELECT sample_id FROM results WHERE rule <> '' AND (?1 = '' OR rule = ?1))`, rule)
		if err != nil {
			return err
		}
		m, err := res.RowsAffected()
		if err != nil {
			return err
		}
		n = int(m)
		// A result with a rule belongs to a rejected sample, so these are
		// exactly the answers of the samples just requeued.
		_, err = tx.ExecContext(ctx, `DELETE FROM results WHERE rule <> '' AND (?1 = '' OR rule = ?1)
			AND sample_id IN (SELECT id FROM samples WHERE state = 'pending')`, rule)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("requeue rejected (rule %q): %w", rule, err)
	}
	return n, nil
}

// Release returns the listed samples that owner still holds to pending
// without spending attempts. Samples it no longer holds are skipped: the
// caller wants them out of its hands, and they already are.
func (s *Store) Release(ctx context.Context, ids []string, owner string) error {
	if len(ids) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		st, err := s.txStmt(ctx, tx, releaseSQL)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, id := range ids {
			if _, err := st.ExecContext(ctx, id, owner); err != nil {
				return fmt.Errorf("sample %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("release %d samples of %s: %w", len(ids), owner, err)
	}
	return nil
}

// ReleaseOwner returns every sample owner holds to pending without spending attempts.
func (s *Store) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	res, err := s.exec(ctx, nil, `UPDATE samples
		SET state = 'pending', lease_owner = NULL, lease_until = NULL
		WHERE state = 'leased' AND lease_owner = ?`, owner)
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	return int(n), nil
}

// ReleaseOwnerExcept returns owner's leased samples not in keep to pending
// without spending attempts.
func (s *Store) ReleaseOwnerExcept(ctx context.Context, owner string, keep []string) (int, error) {
	if keep == nil {
		keep = []string{}
	}
	ids, err := json.Marshal(keep)
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	res, err := s.exec(ctx, nil, `UPDATE samples
		SET state = 'pending', lease_owner = NULL, lease_until = NULL
		WHERE state = 'leased' AND lease_owner = ? AND id NOT IN (SELECT value FROM json_each(?))`, owner, string(ids))
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	return int(n), nil
}

// RequeueDead returns matching dead samples to pending with attempts reset.
func (s *Store) RequeueDead(ctx context.Context, reasonContains string) (int, error) {
	res, err := s.exec(ctx, nil, `UPDATE samples
		SET state = 'pending', attempts = 0, not_before = 0, last_error = NULL, last_error_at = NULL, finished_at = NULL
		WHERE state = 'dead' AND (? = '' OR instr(last_error, ?) > 0)`,
		reasonContains, reasonContains)
	if err != nil {
		return 0, fmt.Errorf("requeue dead: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("requeue dead: %w", err)
	}
	return int(n), nil
}

// ExpireLeases returns samples whose lease ended before now to pending
// without spending attempts.
func (s *Store) ExpireLeases(ctx context.Context, now time.Time) (int, error) {
	res, err := s.exec(ctx, nil, `UPDATE samples
		SET state = 'pending', lease_owner = NULL, lease_until = NULL
		WHERE state = 'leased' AND lease_until < ?`, ns(now))
	if err != nil {
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	return int(n), nil
}

// blobColumn scans a BLOB (or an early schema's TEXT) column without
// database/sql's copy: Scan into []byte or any copies what the driver
// returned, and that copy of a body or an answer is the only one kept.
// modernc.org/sqlite copies every BLOB it returns into a slice of its own
// (conn.columnBlob), so the slice outlives the row; TestScannedBlobsOutliveTheirRows
// would catch a driver that reused it.
type blobColumn struct {
	b     []byte
	valid bool // false for NULL
}

func (c *blobColumn) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		c.b, c.valid = nil, false
	case []byte:
		c.b, c.valid = v, true
	case string:
		c.b, c.valid = []byte(v), true
	default:
		return fmt.Errorf("scan %T into a blob", src)
	}
	return nil
}
