package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// ingestSQL inserts a batch sent as arrays (ids distinct), in order (seq
// is claim order); ON CONFLICT DO NOTHING makes a sample ingested by any
// worker stored once. A row whose id a row from another origin already
// took is recorded as a duplicate instead, with the row the sample came
// from; the same row read again is no duplicate.
const ingestSQL = `WITH v AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::int4[], $6::int4[], $7::text[], $8::text[])
			WITH ORDINALITY AS v(id, partition, lane, body, prompt_tokens, origin_file, origin_pos, origin, i)
	), ins AS (
		INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin_file, origin_pos, state)
		SELECT id, partition, lane, body, prompt_tokens, origin_file, origin_pos, 0 FROM v
		ORDER BY i
		ON CONFLICT (id) DO NOTHING
		RETURNING partition, lane
	), counted AS (
		INSERT INTO counts AS c (partition, lane, state, shard, n)
		SELECT partition, lane, 0, pg_backend_pid() % 256, count(*) FROM ins
		GROUP BY partition, lane ORDER BY partition, lane
		ON CONFLICT (partition, lane, state, shard) DO UPDATE SET n = c.n + excluded.n
	), ` + duplicatesCTE + `
	SELECT 1 FROM ins`

// duplicatesCTE records the rows of CTE v whose id a stored sample from
// another origin holds.
const duplicatesCTE = `dup AS (
		INSERT INTO ingest_duplicates (origin, id, partition, first_origin, same_content, created_at)
		SELECT v.origin, v.id, v.partition, o.prefix || s.origin_pos, s.body = v.body, $9
		FROM v JOIN samples s ON s.id = v.id JOIN origins o ON o.id = s.origin_file
		WHERE s.origin_file <> v.origin_file OR s.origin_pos <> v.origin_pos
		ON CONFLICT (origin) DO NOTHING
	)`

// laterDuplicatesSQL records the rows of a batch that repeat an id of an
// earlier row of the same batch, once that row is stored.
const laterDuplicatesSQL = `WITH v AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::int4[], $6::int4[], $7::text[], $8::text[])
			AS v(id, partition, lane, body, prompt_tokens, origin_file, origin_pos, origin)
	), ` + duplicatesCTE + `
	SELECT 1`

// ingestArrays are the columns of a batch sent as arrays.
type ingestArrays struct {
	ids, parts, lanes, pos, origins []string
	bodies                          [][]byte
	tokens, files                   []int32
}

func (a *ingestArrays) add(smp store.NewSample, file int32) {
	_, pos := store.SplitOrigin(text(smp.Origin))
	a.ids, a.parts, a.lanes = append(a.ids, smp.ID), append(a.parts, smp.Partition), append(a.lanes, smp.Lane)
	a.pos, a.origins = append(a.pos, pos), append(a.origins, text(smp.Origin))
	a.bodies, a.tokens, a.files = append(a.bodies, nonNil(smp.Body)), append(a.tokens, int32(smp.PromptTokens)), append(a.files, file)
}

func (a *ingestArrays) args(now int64) []any {
	return []any{a.ids, a.parts, a.lanes, a.bodies, a.tokens, a.files, a.pos, a.origins, now}
}

// Ingest inserts the samples whose ID is new, in one statement, and records
// rows that repeat a taken id as duplicates.
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
	// The first row of an id in the batch is the one inserted; the later
	// ones are duplicates of whatever row then holds it.
	var first, later ingestArrays
	firstOrigin := make(map[string]string, len(samples))
	for i, smp := range samples {
		o, seen := firstOrigin[smp.ID]
		switch {
		case !seen:
			firstOrigin[smp.ID] = smp.Origin
			first.add(smp, files[i])
		case o != smp.Origin:
			later.add(smp, files[i])
		}
	}
	now := ns(s.now())
	tag, err := s.pool.Exec(ctx, ingestSQL, first.args(now)...)
	if err != nil {
		return 0, fmt.Errorf("ingest %d samples: %w", len(samples), err)
	}
	if err := s.rebuild(ctx, &first, now); err != nil {
		return 0, fmt.Errorf("ingest %d samples: %w", len(samples), err)
	}
	if len(later.ids) > 0 {
		if _, err := s.pool.Exec(ctx, laterDuplicatesSQL, later.args(now)...); err != nil {
			return 0, fmt.Errorf("ingest %d samples: record duplicate ids: %w", len(samples), err)
		}
	}
	return int(tag.RowsAffected()), nil
}

// rebuildSQL gives the samples of a batch held back for rebuilding the
// body, prompt tokens, lane and origin their rows map to now, and makes
// them claimable, moving their counts.
var rebuildSQL = movedSQL(`UPDATE samples s SET body = v.body, prompt_tokens = v.prompt_tokens, lane = v.lane,
		origin_file = v.origin_file, origin_pos = v.origin_pos, not_before = 0
	FROM (SELECT id, lane AS old_lane FROM samples WHERE not_before < 0 AND id = ANY($1) FOR UPDATE) o,
		unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::int4[], $6::int4[], $7::text[])
			AS v(id, partition, lane, body, prompt_tokens, origin_file, origin_pos)
	WHERE s.id = o.id AND v.id = o.id
	RETURNING s.partition, o.old_lane AS lane_from, s.state AS state_from, s.lane, s.state`, "1")

// rebuild runs rebuildSQL on batch a when any sample is held back (the
// partial index answers that at once; a job not rebuilding pays one
// lookup per batch).
func (s *Store) rebuild(ctx context.Context, a *ingestArrays, now int64) error {
	var stale bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM samples WHERE not_before < 0)`).Scan(&stale); err != nil {
		return fmt.Errorf("look for samples to rebuild: %w", err)
	}
	if !stale {
		return nil
	}
	args := a.args(now)
	if _, err := s.pool.Exec(ctx, rebuildSQL, args[:7]...); err != nil {
		return fmt.Errorf("rebuild samples: %w", err)
	}
	return nil
}

// DropStale deletes partition's samples still held back for rebuilding,
// and their counts.
func (s *Store) DropStale(ctx context.Context, partition string) (int, error) {
	tag, err := s.pool.Exec(ctx, `WITH d AS (
			DELETE FROM samples WHERE partition = $1 AND not_before < 0 AND state = 0 RETURNING partition, lane, state
		), counted AS (
			INSERT INTO counts AS c (partition, lane, state, shard, n)
			SELECT partition, lane, state, pg_backend_pid() % 256, -count(*) FROM d
			GROUP BY partition, lane, state ORDER BY partition, lane, state
			ON CONFLICT (partition, lane, state, shard) DO UPDATE SET n = c.n + excluded.n
		) SELECT 1 FROM d`, text(partition))
	if err != nil {
		return 0, fmt.Errorf("drop samples of %s left from an earlier mapping: %w", partition, err)
	}
	return int(tag.RowsAffected()), nil
}

// ForgetIngestErrors drops partition's bad rows recorded for file: its
// origins "file:..." sort between file+":" and file+";" (':' + 1) in the
// origin column's C collation, a range of its index.
func (s *Store) ForgetIngestErrors(ctx context.Context, partition, file string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM ingest_errors WHERE origin >= $1 AND origin < $2 AND partition = $3`,
		text(file)+":", text(file)+";", text(partition)); err != nil {
		return fmt.Errorf("forget bad rows of %s in %s: %w", file, partition, err)
	}
	return nil
}

// originFiles returns the origins-table id of each sample's file part. New
// file parts are inserted (by whichever worker comes first) and read back
// in statements of their own, so ids enter the cache only once committed.
func (s *Store) originFiles(ctx context.Context, samples []store.NewSample) ([]int32, error) {
	ids := make([]int32, len(samples))
	var missing []string
	s.mu.Lock()
	for i, smp := range samples {
		prefix, _ := store.SplitOrigin(text(smp.Origin))
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
		prefix, _ := store.SplitOrigin(text(smp.Origin))
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
		ON CONFLICT (origin, partition) DO NOTHING`, origins, parts, fields, reasons, ns(s.now()))
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
	return store.EachPage(pageSize, func(after int64) ([]store.IngestError, int64, error) {
		rows, err := s.pool.Query(ctx, `SELECT seq, partition, origin, field, reason FROM ingest_errors
			WHERE seq > $1 ORDER BY seq LIMIT $2`, after, pageSize)
		if err != nil {
			return nil, 0, fmt.Errorf("read ingest errors after #%d: %w", after, err)
		}
		var last int64
		page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.IngestError, error) {
			var e store.IngestError
			err := row.Scan(&last, &e.Partition, &e.Origin, &e.Field, &e.Reason)
			return e, err
		})
		if err != nil {
			return nil, 0, fmt.Errorf("read ingest errors after #%d: %w", after, err)
		}
		return page, last, nil
	}, fn)
}

// claimSQL leases n due samples of a lane: conversations waiting for their
// next turn first (their prefix is still cached at the server that
// answered the turn before), then the oldest. Every CTE locks what it
// picks with SKIP LOCKED, so concurrent claimers take disjoint rows without
// waiting; the sides come from three partial indexes (later turns, every
// sample never told to wait, retries now due), each holding the best n of
// its kind, and the best n of their union by (first turn, seq) are leased
// (the rest are unlocked at commit).
//
// A later turn the caller keeps ($6..$8: ids, turns and the tokens of the
// leases that stored the turn before, store.Queue.ClaimKept) comes back
// without its body when the sample's last lease (prev, the token before
// this claim's) is the caller's: no one claimed it since.
const claimSQL = `WITH later AS (
		SELECT seq, false AS fresh, lease_token AS prev FROM samples
		WHERE state = 0 AND not_before = 0 AND turn > 0 AND lane = $1
		ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
	), ready AS (
		SELECT seq, turn = 0 AS fresh, lease_token AS prev FROM samples
		WHERE state = 0 AND not_before = 0 AND lane = $1
		ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
	), due AS (
		SELECT seq, turn = 0 AS fresh, lease_token AS prev FROM samples
		WHERE state = 0 AND not_before > 0 AND lane = $1 AND not_before <= $3
		ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
	), pick AS (
		SELECT seq, max(prev) AS prev FROM (SELECT * FROM later UNION ALL SELECT * FROM ready UNION ALL SELECT * FROM due) r
		GROUP BY seq ORDER BY bool_and(fresh), seq LIMIT $2
	), kept AS (
		SELECT * FROM unnest($6::text[], $7::int[], $8::bigint[]) AS k(id, turn, token)
	), u AS (
		UPDATE samples s SET state = 1, lease_owner = $4, lease_until = $5, not_before = 0, lease_token = nextval('lease_tokens')
		FROM pick WHERE s.seq = pick.seq
		RETURNING s.seq, s.id, s.partition, s.lane AS lane_from, 0::int2 AS state_from, s.lane, s.state,
			s.body, s.prompt_tokens, s.attempts, s.turn, s.lease_token,
			s.turn > 0 AND EXISTS (SELECT 1 FROM kept k WHERE k.id = s.id AND k.turn = s.turn AND k.token <> 0 AND k.token = pick.prev) AS kept
	), ` + countsCTE + `
	SELECT seq, id, partition, lane, CASE WHEN kept THEN NULL ELSE body END, prompt_tokens, attempts, turn, lease_token, kept FROM u`

// Claim leases up to n claimable samples of lane, later turns first, then oldest first.
func (s *Store) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	return s.ClaimKept(ctx, lane, n, owner, lease, nil)
}

// ClaimKept is Claim that leaves out what the caller keeps (store.Queue):
// a kept turn whose sample was claimed by no one since the caller's lease
// that stored the turn before (the lease tokens say so) has the body and
// answers the caller holds.
func (s *Store) ClaimKept(ctx context.Context, lane string, n int, owner string, lease time.Duration, kept []store.Kept) ([]store.Claimed, error) {
	if n <= 0 {
		return nil, nil
	}
	if owner == "" {
		return nil, fmt.Errorf("claim lane %s: empty owner", lane)
	}
	now := s.now()
	until := ns(now.Add(lease))
	ids, turns, tokens := make([]string, len(kept)), make([]int32, len(kept)), make([]int64, len(kept))
	for i, k := range kept {
		ids[i], turns[i], tokens[i] = text(k.ID), int32(k.Turn), k.Token
	}
	rows, err := s.pool.Query(ctx, claimSQL, lane, n, ns(now), owner, until, ids, turns, tokens)
	if err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", lane, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Claimed, error) {
		var c store.Claimed
		var pt, att, turn int32
		err := row.Scan(&c.Seq, &c.ID, &c.Partition, &c.Lane, &c.Body, &pt, &att, &turn, &c.Token, &c.Kept)
		c.PromptTokens, c.Attempts, c.Turn = int(pt), int(att), int(turn)
		c.Body = unblob(c.Body)
		c.LeaseUntil = fromNS(until)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim lane %s: %w", lane, err)
	}
	// RETURNING order is unspecified; hand them out in claim order.
	slices.SortFunc(out, store.ClaimOrder)
	for i := range out {
		c := &out[i]
		if c.Turn > 0 && !c.Kept {
			// Stored turns never change, so reading them after the claim is
			// safe: the lease keeps anyone else from adding one.
			if c.Prior, err = s.priorTurns(ctx, c.ID, c.Turn); err != nil {
				return nil, fmt.Errorf("claim lane %s: sample %s: %w", lane, c.ID, err)
			}
		}
	}
	return out, nil
}

const turnCols = `turn, lane, response, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens,
	endpoint, duration_ns, ttft_ns, attempts, generation`

// scanTurn reads turnCols (after extra leading columns).
func scanTurn(row pgx.CollectableRow, extra ...any) (store.Result, error) {
	var r store.Result
	var turn, pt, ct, rt, att, gen int32
	var dur, ttft int64
	dest := append(extra, &turn, &r.Lane, &r.Response, &r.FinishReason, &pt, &ct, &rt, &r.Endpoint, &dur, &ttft, &att, &gen)
	if err := row.Scan(dest...); err != nil {
		return r, err
	}
	r.Turn, r.PromptTokens, r.CompletionTokens, r.ReasoningTokens, r.Attempts = int(turn), int(pt), int(ct), int(rt), int(att)
	r.Generation = int(gen)
	r.Response, r.Duration, r.TTFT = unblob(r.Response), time.Duration(dur), time.Duration(ttft)
	return r, nil
}

// priorTurns reads the stored answers to turns 0..upTo-1 of a sample.
func (s *Store) priorTurns(ctx context.Context, id string, upTo int) ([]store.Result, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+turnCols+` FROM turns WHERE sample_id = $1 AND turn < $2 ORDER BY turn`, id, upTo)
	if err != nil {
		return nil, fmt.Errorf("read earlier turns: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Result, error) { return scanTurn(row) })
	if err != nil {
		return nil, fmt.Errorf("read earlier turns: %w", err)
	}
	if len(out) != upTo {
		return nil, fmt.Errorf("read earlier turns: %d stored, want %d", len(out), upTo)
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

// RequeueRejected returns rejected samples (of rule, "" = all) to pending
// at the rejected turn with attempts reset, dropping the rejected answers
// and their statistics, in one statement.
func (s *Store) RequeueRejected(ctx context.Context, rule string) (int, error) {
	tag, err := s.pool.Exec(ctx, `WITH u AS (
			UPDATE samples SET state = 0, attempts = 0, not_before = 0, finished_at = NULL
			WHERE state = 3 AND id IN (SELECT sample_id FROM results WHERE rule <> '' AND ($1 = '' OR rule = $1))
			RETURNING id, partition, lane AS lane_from, 3::int2 AS state_from, lane, state
		), `+countsCTE+`, a AS (
			DELETE FROM results r USING u WHERE r.sample_id = u.id
			RETURNING r.partition, r.lane, r.finish_reason, r.rule, r.reasoning_tokens, r.end_reason,
				r.prompt_tokens, r.completion_tokens, r.finished_at
		), `+statsCTEs("a", -1, false)+`
		SELECT 1 FROM u`, text(rule))
	if err != nil {
		return 0, fmt.Errorf("requeue rejected (rule %q): %w", rule, err)
	}
	return int(tag.RowsAffected()), nil
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
