package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// ingestSQL inserts a batch sent as arrays, in order (seq is claim order);
// ON CONFLICT DO NOTHING makes a sample ingested by any worker, or twice in
// one batch, stored once.
const ingestSQL = `WITH ins AS (
		INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin_file, origin_pos, state)
		SELECT id, partition, lane, body, prompt_tokens, origin_file, origin_pos, 0
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::int4[], $6::int4[], $7::text[]) WITH ORDINALITY
			AS v(id, partition, lane, body, prompt_tokens, origin_file, origin_pos, i)
		ORDER BY i
		ON CONFLICT (id) DO NOTHING
		RETURNING partition, lane
	), counted AS (
		INSERT INTO counts AS c (partition, lane, state, shard, n)
		SELECT partition, lane, 0, pg_backend_pid() % 256, count(*) FROM ins
		GROUP BY partition, lane ORDER BY partition, lane
		ON CONFLICT (partition, lane, state, shard) DO UPDATE SET n = c.n + excluded.n
	)
	SELECT 1 FROM ins`

// Ingest inserts the samples whose ID is new, in one statement.
func (s *Store) Ingest(ctx context.Context, samples []store.NewSample) (int, error) {
	if len(samples) == 0 {
		return 0, nil
	}
	n := len(samples)
	var (
		ids, parts, lanes, pos = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		bodies                 = make([][]byte, n)
		tokens                 = make([]int32, n)
	)
	for i, smp := range samples {
		if smp.ID == "" {
			return 0, fmt.Errorf("ingest: sample %d (%s) has an empty id", i, smp.Origin)
		}
		ids[i], parts[i], lanes[i] = smp.ID, smp.Partition, smp.Lane
		_, pos[i] = splitOrigin(text(smp.Origin))
		bodies[i], tokens[i] = nonNil(smp.Body), int32(smp.PromptTokens)
	}
	files, err := s.originFiles(ctx, samples)
	if err != nil {
		return 0, fmt.Errorf("ingest %d samples: %w", n, err)
	}
	tag, err := s.pool.Exec(ctx, ingestSQL, ids, parts, lanes, bodies, tokens, files, pos)
	if err != nil {
		return 0, fmt.Errorf("ingest %d samples: %w", len(samples), err)
	}
	return int(tag.RowsAffected()), nil
}

// splitOrigin cuts "file:line" (or "file:row N") after its last ':', so the
// file part is stored once per file.
func splitOrigin(origin string) (prefix, pos string) {
	i := strings.LastIndexByte(origin, ':')
	return origin[:i+1], origin[i+1:]
}

// originFiles returns the origins-table id of each sample's file part. New
// file parts are inserted (by whichever worker comes first) and read back
// in statements of their own, so ids enter the cache only once committed.
func (s *Store) originFiles(ctx context.Context, samples []store.NewSample) ([]int32, error) {
	ids := make([]int32, len(samples))
	var missing []string
	s.mu.Lock()
	for i, smp := range samples {
		prefix, _ := splitOrigin(text(smp.Origin))
		id, ok := s.origins[prefix]
		if !ok && !slices.Contains(missing, prefix) {
			missing = append(missing, prefix)
		}
		ids[i] = id
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return ids, nil
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO origins (prefix) SELECT unnest($1::text[]) ON CONFLICT (prefix) DO NOTHING`, missing); err != nil {
		return nil, fmt.Errorf("record origin files: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT prefix, id FROM origins WHERE prefix = ANY($1)`, missing)
	if err != nil {
		return nil, fmt.Errorf("read origin files: %w", err)
	}
	type origin struct {
		prefix string
		id     int32
	}
	found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (origin, error) {
		var o origin
		err := row.Scan(&o.prefix, &o.id)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("read origin files: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range found {
		s.origins[o.prefix] = o.id
	}
	for i, smp := range samples {
		prefix, _ := splitOrigin(text(smp.Origin))
		id, ok := s.origins[prefix]
		if !ok {
			return nil, fmt.Errorf("origin file %q has no id after recording it", prefix)
		}
		ids[i] = id
	}
	return ids, nil
}

// AddIngestErrors records bad rows, ignoring origins already recorded. The
// rows keep their order, so IngestErrors lists them as first seen.
func (s *Store) AddIngestErrors(ctx context.Context, errs []store.IngestError) error {
	if len(errs) == 0 {
		return nil
	}
	n := len(errs)
	origins, parts, fields, reasons := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, e := range errs {
		origins[i], parts[i], fields[i], reasons[i] = text(e.Origin), text(e.Partition), text(e.Field), text(e.Reason)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO ingest_errors (origin, partition, field, reason, created_at)
		SELECT origin, partition, field, reason, $5
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS v(origin, partition, field, reason, i)
		ORDER BY i
		ON CONFLICT (origin) DO NOTHING`, origins, parts, fields, reasons, ns(s.now()))
	if err != nil {
		return fmt.Errorf("add %d ingest errors: %w", n, err)
	}
	return nil
}

// limitArg maps "no limit" (<= 0) to SQL NULL, which LIMIT reads as none.
func limitArg(limit int) *int64 {
	if limit <= 0 {
		return nil
	}
	v := int64(limit)
	return &v
}

// IngestErrors returns recorded bad rows in the order first seen.
func (s *Store) IngestErrors(ctx context.Context, limit int) ([]store.IngestError, error) {
	rows, err := s.pool.Query(ctx, `SELECT partition, origin, field, reason FROM ingest_errors ORDER BY seq LIMIT $1`, limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("read ingest errors: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanIngestError)
	if err != nil {
		return nil, fmt.Errorf("read ingest errors: %w", err)
	}
	return out, nil
}

func scanIngestError(row pgx.CollectableRow) (store.IngestError, error) {
	var e store.IngestError
	err := row.Scan(&e.Partition, &e.Origin, &e.Field, &e.Reason)
	return e, err
}

// IngestErrorCount counts recorded bad rows.
func (s *Store) IngestErrorCount(ctx context.Context) (int, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM ingest_errors`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count ingest errors: %w", err)
	}
	return int(n), nil
}

// pageSize bounds one page of EachIngestError and Finished: memory stays at
// one page, and no statement runs while the callback does.
const pageSize = 1000

// EachIngestError calls fn for every bad row in the order first recorded
// (source order), a page at a time by the primary key.
func (s *Store) EachIngestError(ctx context.Context, fn func(store.IngestError) error) error {
	var after int64
	for {
		rows, err := s.pool.Query(ctx, `SELECT seq, partition, origin, field, reason FROM ingest_errors
			WHERE seq > $1 ORDER BY seq LIMIT $2`, after, pageSize)
		if err != nil {
			return fmt.Errorf("read ingest errors after #%d: %w", after, err)
		}
		var last int64
		page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.IngestError, error) {
			var e store.IngestError
			err := row.Scan(&last, &e.Partition, &e.Origin, &e.Field, &e.Reason)
			return e, err
		})
		if err != nil {
			return fmt.Errorf("read ingest errors after #%d: %w", after, err)
		}
		for _, e := range page {
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(page) < pageSize {
			return nil
		}
		after = last
	}
}

// claimSQL leases the oldest n due samples of a lane. Both CTEs lock what
// they pick with SKIP LOCKED, so concurrent claimers take disjoint rows
// without waiting; the two sides come from the two partial indexes and the
// oldest n of their union are leased (the rest are unlocked at commit).
const claimSQL = `WITH ready AS (
		SELECT seq FROM samples
		WHERE state = 0 AND not_before = 0 AND lane = $1
		ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
	), due AS (
		SELECT seq FROM samples
		WHERE state = 0 AND not_before > 0 AND lane = $1 AND not_before <= $3
		ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
	), pick AS (
		SELECT seq FROM (SELECT seq FROM ready UNION ALL SELECT seq FROM due) r ORDER BY seq LIMIT $2
	), u AS (
		UPDATE samples s SET state = 1, lease_owner = $4, lease_until = $5, not_before = 0
		FROM pick WHERE s.seq = pick.seq
		RETURNING s.seq, s.id, s.partition, s.lane AS lane_from, 0::int2 AS state_from, s.lane, s.state,
			s.body, s.prompt_tokens, s.attempts
	), ` + countsCTE + `
	SELECT seq, id, partition, lane, body, prompt_tokens, attempts FROM u`

// Claim leases up to n claimable samples of lane, oldest first.
func (s *Store) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	if n <= 0 {
		return nil, nil
	}
	if owner == "" {
		return nil, fmt.Errorf("claim lane %s: empty owner", lane)
	}
	now := s.now()
	until := ns(now.Add(lease))
	rows, err := s.pool.Query(ctx, claimSQL, lane, n, ns(now), owner, until)
	if err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", lane, err)
	}
	type seqClaim struct {
		seq int64
		c   store.Claimed
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (seqClaim, error) {
		var sc seqClaim
		var pt, att int32
		err := row.Scan(&sc.seq, &sc.c.ID, &sc.c.Partition, &sc.c.Lane, &sc.c.Body, &pt, &att)
		sc.c.PromptTokens, sc.c.Attempts = int(pt), int(att)
		sc.c.Body = unblob(sc.c.Body)
		sc.c.LeaseUntil = fromNS(until)
		return sc, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", lane, err)
	}
	// RETURNING order is unspecified; hand them out oldest first.
	slices.SortFunc(got, func(a, b seqClaim) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]store.Claimed, len(got))
	for i, sc := range got {
		out[i] = sc.c
	}
	return out, nil
}

// ExtendLeases pushes every lease owner holds to now+lease.
func (s *Store) ExtendLeases(ctx context.Context, owner string, lease time.Duration) error {
	if _, err := s.pool.Exec(ctx, `UPDATE samples SET lease_until = $1 WHERE state = 1 AND lease_owner = $2`,
		ns(s.now().Add(lease)), owner); err != nil {
		return fmt.Errorf("extend leases of %s: %w", owner, err)
	}
	return nil
}

// Complete stores r and marks the sample done, spending its attempt.
func (s *Store) Complete(ctx context.Context, id, owner string, r store.Result) error {
	if err := s.commits.Do(ctx, transition{kind: opFinish, id: id, owner: owner, state: stateDone, result: r}); err != nil {
		return fmt.Errorf("complete %s: %w", id, err)
	}
	return nil
}

// Reject stores r with reason and marks the sample rejected, spending its attempt.
func (s *Store) Reject(ctx context.Context, id, owner string, r store.Result, reason string) error {
	if err := s.commits.Do(ctx, transition{kind: opFinish, id: id, owner: owner, state: stateRejected, result: r, text: reason}); err != nil {
		return fmt.Errorf("reject %s: %w", id, err)
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

// Release returns the listed samples owner still holds to pending without
// spending attempts; samples it no longer holds are skipped.
func (s *Store) Release(ctx context.Context, ids []string, owner string) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, movedSQL(`UPDATE samples SET state = 0, lease_owner = NULL, lease_until = NULL
		WHERE id = ANY($1) AND state = 1 AND lease_owner = $2 `+moved("1"), "1"), ids, owner); err != nil {
		return fmt.Errorf("release %d samples of %s: %w", len(ids), owner, err)
	}
	return nil
}

// ReleaseOwner returns every sample owner holds to pending without spending attempts.
func (s *Store) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	tag, err := s.pool.Exec(ctx, movedSQL(`UPDATE samples SET state = 0, lease_owner = NULL, lease_until = NULL
		WHERE state = 1 AND lease_owner = $1 `+moved("1"), "1"), owner)
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	return int(tag.RowsAffected()), nil
}

// ReleaseOwnerExcept returns owner's leased samples not in keep to pending
// without spending attempts.
func (s *Store) ReleaseOwnerExcept(ctx context.Context, owner string, keep []string) (int, error) {
	if keep == nil {
		keep = []string{}
	}
	tag, err := s.pool.Exec(ctx, movedSQL(`UPDATE samples SET state = 0, lease_owner = NULL, lease_until = NULL
		WHERE state = 1 AND lease_owner = $1 AND NOT (id = ANY($2)) `+moved("1"), "1"), owner, keep)
	if err != nil {
		return 0, fmt.Errorf("release samples of %s: %w", owner, err)
	}
	return int(tag.RowsAffected()), nil
}

// RequeueDead returns matching dead samples to pending with attempts reset.
func (s *Store) RequeueDead(ctx context.Context, reasonContains string) (int, error) {
	tag, err := s.pool.Exec(ctx, movedSQL(`UPDATE samples
		SET state = 0, attempts = 0, not_before = 0, last_error = NULL, last_error_at = NULL, finished_at = NULL
		WHERE state = 4 AND ($1 = '' OR strpos(last_error, $1) > 0) `+moved("4"), "1"), text(reasonContains))
	if err != nil {
		return 0, fmt.Errorf("requeue dead: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// ExpireLeases returns samples whose lease ended before now to pending
// without spending attempts.
func (s *Store) ExpireLeases(ctx context.Context, now time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, movedSQL(`UPDATE samples SET state = 0, lease_owner = NULL, lease_until = NULL
		WHERE state = 1 AND lease_until < $1 `+moved("1"), "1"), ns(now))
	if err != nil {
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
