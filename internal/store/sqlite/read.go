package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// finishedPage bounds one Finished query, so a concurrent writer waits for
// at most one page, never for a whole export, and memory holds one page of
// conversations (a multi-turn one carries every earlier answer).
const finishedPage = 256

// Counts returns the non-empty (partition, lane, state) cells, sorted.
func (s *Store) Counts(ctx context.Context) ([]store.Count, error) {
	rows, err := s.query(ctx, `SELECT partition, lane, state, n FROM counts
		WHERE n > 0 ORDER BY partition, lane, state`)
	if err != nil {
		return nil, fmt.Errorf("count samples: %w", err)
	}
	defer rows.Close()
	var out []store.Count
	for rows.Next() {
		var c store.Count
		var st string
		if err := rows.Scan(&c.Partition, &c.Lane, &st, &c.N); err != nil {
			return nil, fmt.Errorf("count samples: %w", err)
		}
		c.State = store.State(st)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count samples: %w", err)
	}
	return out, nil
}

// ThroughputSince sums results (done or rejected) finished at or after t,
// and the tokens of earlier turns stored since t; First and Last span both.
func (s *Store) ThroughputSince(ctx context.Context, t time.Time) (store.Throughput, error) {
	var tp store.Throughput
	var first, last sql.NullInt64
	// Each part reads one covering index; min and max of the two tables
	// take whichever is not NULL.
	st, err := s.stmt(ctx, `SELECT (SELECT count(*) FROM results WHERE finished_at >= ?1),
		(SELECT coalesce(sum(completion_tokens), 0) FROM results WHERE finished_at >= ?1)
			+ (SELECT coalesce(sum(completion_tokens), 0) FROM turns WHERE finished_at >= ?1),
		(SELECT coalesce(sum(prompt_tokens), 0) FROM results WHERE finished_at >= ?1)
			+ (SELECT coalesce(sum(prompt_tokens), 0) FROM turns WHERE finished_at >= ?1),
		min(coalesce((SELECT min(finished_at) FROM results WHERE finished_at >= ?1), (SELECT min(finished_at) FROM turns WHERE finished_at >= ?1)),
			coalesce((SELECT min(finished_at) FROM turns WHERE finished_at >= ?1), (SELECT min(finished_at) FROM results WHERE finished_at >= ?1))),
		max(coalesce((SELECT max(finished_at) FROM results WHERE finished_at >= ?1), (SELECT max(finished_at) FROM turns WHERE finished_at >= ?1)),
			coalesce((SELECT max(finished_at) FROM turns WHERE finished_at >= ?1), (SELECT max(finished_at) FROM results WHERE finished_at >= ?1)))`)
	if err == nil {
		err = st.QueryRowContext(ctx, ns(t)).Scan(&tp.Samples, &tp.CompletionTokens, &tp.PromptTokens, &first, &last)
	}
	if err != nil {
		return store.Throughput{}, fmt.Errorf("throughput since %s: %w", t.Format(time.RFC3339), err)
	}
	if first.Valid && last.Valid {
		tp.First, tp.Last = fromNS(first.Int64), fromNS(last.Int64)
	}
	return tp, nil
}

// Finished calls fn for every done, rejected or dead sample in ID order. It
// reads a page at a time and holds no connection while fn runs, so fn may
// call the store.
func (s *Store) Finished(ctx context.Context, fn func(store.Row) error) error {
	// ingest refuses empty ids, so every id sorts after "", the first key
	return store.EachPage(finishedPage, func(after string) ([]store.Row, string, error) {
		page, err := s.finishedPage(ctx, after)
		if err != nil {
			return nil, "", fmt.Errorf("read finished samples after %q: %w", after, err)
		}
		if len(page) == 0 {
			return nil, "", nil
		}
		return page, page[len(page)-1].ID, nil
	}, fn)
}

func (s *Store) finishedPage(ctx context.Context, after string) ([]store.Row, error) {
	rows, err := s.query(ctx, `SELECT s.id, s.partition, s.lane, s.state, (SELECT body FROM sample_bodies b WHERE b.seq = s.seq), s.attempts,
			coalesce(s.last_error, ''), s.finished_at,
			r.response, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.endpoint,
			r.duration_ns, r.ttft_ns, r.reason, r.rule, r.turn, r.reasoning_tokens, r.end_reason, r.generation,
			coalesce((SELECT prefix FROM origins WHERE id = s.origin_file), '') || s.origin_pos
		FROM samples s LEFT JOIN results r ON r.sample_id = s.id
		WHERE s.finished_at IS NOT NULL AND s.id > ?
		ORDER BY s.id LIMIT ?`, after, finishedPage)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]store.Row, 0, finishedPage)
	multi := false
	for rows.Next() {
		var (
			r                        store.Row
			st, lastErr              string
			finishedAt               int64
			response                 []byte
			finishReason             sql.NullString
			pt, ct, dur, ttft        sql.NullInt64
			turn, reasoning, gen     sql.NullInt64
			endpoint, rejectBy, rule sql.NullString
			endReason                sql.NullString
		)
		if err := rows.Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Body, &r.Attempts, &lastErr, &finishedAt,
			&response, &finishReason, &pt, &ct, &endpoint, &dur, &ttft, &rejectBy, &rule, &turn, &reasoning, &endReason, &gen, &r.Origin); err != nil {
			return nil, err
		}
		r.State = store.State(st)
		r.Body = unblob(r.Body)
		r.FinishedAt = fromNS(finishedAt)
		if finishReason.Valid {
			r.Result = store.Result{
				Response:         unblob(response),
				FinishReason:     finishReason.String,
				PromptTokens:     int(pt.Int64),
				CompletionTokens: int(ct.Int64),
				Endpoint:         endpoint.String,
				Duration:         time.Duration(dur.Int64),
				TTFT:             time.Duration(ttft.Int64),
				Turn:             int(turn.Int64),
				ReasoningTokens:  int(reasoning.Int64),
				EndReason:        endReason.String,
				Generation:       int(gen.Int64),
			}
			multi = multi || r.Result.Turn > 0
		}
		switch r.State {
		case store.Rejected:
			r.Reason, r.Rule = rejectBy.String, rule.String
		case store.Dead:
			r.Reason = lastErr
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	if multi {
		if err := s.attachPrior(ctx, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// attachPrior reads the earlier turns of the multi-turn rows of a page
// with one range query over the turns primary key.
func (s *Store) attachPrior(ctx context.Context, page []store.Row) error {
	at := make(map[string]int, len(page))
	for i, r := range page {
		if r.Result.Turn > 0 {
			at[r.ID] = i
		}
	}
	rows, err := s.query(ctx, `SELECT sample_id, turn, lane, response, finish_reason, prompt_tokens, completion_tokens,
			reasoning_tokens, endpoint, duration_ns, ttft_ns, attempts, generation
		FROM turns WHERE sample_id >= ? AND sample_id <= ? ORDER BY sample_id, turn`, page[0].ID, page[len(page)-1].ID)
	if err != nil {
		return fmt.Errorf("read earlier turns: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		t, err := scanTurn(rows, &id)
		if err != nil {
			return fmt.Errorf("read earlier turns: %w", err)
		}
		i, ok := at[id]
		if !ok || t.Turn >= page[i].Result.Turn {
			continue // a sample still in progress, or not finished in this page
		}
		page[i].Prior = append(page[i].Prior, t)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read earlier turns: %w", err)
	}
	for _, i := range at {
		if got, want := len(page[i].Prior), page[i].Result.Turn; got != want {
			return fmt.Errorf("sample %s: %d earlier turns stored, want %d", page[i].ID, got, want)
		}
	}
	return nil
}

// LastErrors returns the samples with the most recent retry or dead-letter
// reasons, newest first, at most limit (all when limit <= 0). Rows carry no
// Result; State is the sample's state now, which may be pending again.
func (s *Store) LastErrors(ctx context.Context, limit int) ([]store.Row, error) {
	rows, err := s.query(ctx, `SELECT id, partition, lane, state, (SELECT body FROM sample_bodies b WHERE b.seq = samples.seq), attempts, last_error,
			coalesce(finished_at, 0)
		FROM samples WHERE last_error_at IS NOT NULL
		ORDER BY last_error_at DESC, seq DESC LIMIT ?`, sqlLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("read last errors: %w", err)
	}
	defer rows.Close()
	var out []store.Row
	for rows.Next() {
		var r store.Row
		var st string
		var finishedAt int64
		if err := rows.Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Body, &r.Attempts, &r.Reason, &finishedAt); err != nil {
			return nil, fmt.Errorf("read last errors: %w", err)
		}
		r.State = store.State(st)
		r.Body = unblob(r.Body)
		r.FinishedAt = fromNS(finishedAt)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read last errors: %w", err)
	}
	return out, nil
}

// PutHeartbeat replaces hb.Owner's heartbeat.
func (s *Store) PutHeartbeat(ctx context.Context, hb store.Heartbeat) error {
	_, err := s.exec(ctx, nil, `INSERT INTO heartbeats (owner, pid, host, time, started, counters)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (owner) DO UPDATE SET pid = excluded.pid, host = excluded.host,
			time = excluded.time, started = excluded.started, counters = excluded.counters`,
		hb.Owner, hb.PID, hb.Host, ns(hb.Time), ns(hb.Started), blob(hb.Counters))
	if err != nil {
		return fmt.Errorf("put heartbeat of %s: %w", hb.Owner, err)
	}
	return nil
}

const heartbeatCols = `owner, pid, host, time, started, counters`

func scanHeartbeat(sc interface{ Scan(...any) error }) (store.Heartbeat, error) {
	var hb store.Heartbeat
	var t, started int64
	err := sc.Scan(&hb.Owner, &hb.PID, &hb.Host, &t, &started, &hb.Counters)
	hb.Time, hb.Started, hb.Counters = fromNS(t), fromNS(started), unblob(hb.Counters)
	return hb, err
}

// LastHeartbeat returns the newest heartbeat of any worker, ok=false when
// none was written.
func (s *Store) LastHeartbeat(ctx context.Context) (store.Heartbeat, bool, error) {
	st, err := s.stmt(ctx, `SELECT `+heartbeatCols+` FROM heartbeats ORDER BY time DESC LIMIT 1`)
	if err != nil {
		return store.Heartbeat{}, false, fmt.Errorf("read heartbeat: %w", err)
	}
	hb, err := scanHeartbeat(st.QueryRowContext(ctx))
	if err == sql.ErrNoRows {
		return store.Heartbeat{}, false, nil
	}
	if err != nil {
		return store.Heartbeat{}, false, fmt.Errorf("read heartbeat: %w", err)
	}
	return hb, true, nil
}

// Heartbeats returns every worker's latest heartbeat, newest first.
func (s *Store) Heartbeats(ctx context.Context) ([]store.Heartbeat, error) {
	rows, err := s.query(ctx, `SELECT `+heartbeatCols+` FROM heartbeats ORDER BY time DESC, owner`)
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	defer rows.Close()
	var out []store.Heartbeat
	for rows.Next() {
		hb, err := scanHeartbeat(rows)
		if err != nil {
			return nil, fmt.Errorf("read heartbeats: %w", err)
		}
		out = append(out, hb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	return out, nil
}

// AddEvent appends an event; a zero Time is stamped with the store clock.
func (s *Store) AddEvent(ctx context.Context, e store.Event) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	_, err := s.exec(ctx, nil, `INSERT INTO events (time, kind, subject, state, evidence, worker) VALUES (?, ?, ?, ?, ?, ?)`,
		ns(e.Time), e.Kind, e.Subject, e.State, e.Evidence, e.Worker)
	if err != nil {
		return fmt.Errorf("add event %s %s: %w", e.Kind, e.Subject, err)
	}
	return nil
}

// Events returns the newest events first (by insertion), at most limit
// (all when limit <= 0).
func (s *Store) Events(ctx context.Context, limit int) ([]store.Event, error) {
	rows, err := s.query(ctx, `SELECT time, kind, subject, state, evidence, worker FROM events
		ORDER BY id DESC LIMIT ?`, sqlLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	defer rows.Close()
	var out []store.Event
	for rows.Next() {
		var e store.Event
		var t int64
		if err := rows.Scan(&t, &e.Kind, &e.Subject, &e.State, &e.Evidence, &e.Worker); err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		e.Time = fromNS(t)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return out, nil
}

// SourceFile returns the manifest entry of path in partition.
func (s *Store) SourceFile(ctx context.Context, partition, path string) (store.SourceFile, bool, error) {
	f := store.SourceFile{Partition: partition, Path: path}
	var mod int64
	st, err := s.stmt(ctx, `SELECT size, mod_time, fingerprint, rows, bad, complete FROM source_files
		WHERE partition = ? AND path = ?`)
	if err == nil {
		err = st.QueryRowContext(ctx, partition, path).Scan(&f.Size, &mod, &f.Fingerprint, &f.Rows, &f.Bad, &f.Complete)
	}
	if err == sql.ErrNoRows {
		return store.SourceFile{}, false, nil
	}
	if err != nil {
		return store.SourceFile{}, false, fmt.Errorf("read manifest entry of %s: %w", path, err)
	}
	f.ModTime = fromNS(mod)
	return f, true, nil
}

// PutSourceFile records f, replacing the entry of its partition and path.
func (s *Store) PutSourceFile(ctx context.Context, f store.SourceFile) error {
	_, err := s.exec(ctx, nil, `INSERT INTO source_files (partition, path, size, mod_time, fingerprint, rows, bad, complete, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (partition, path) DO UPDATE SET size = excluded.size, mod_time = excluded.mod_time,
			fingerprint = excluded.fingerprint, rows = excluded.rows, bad = excluded.bad,
			complete = excluded.complete, updated_at = excluded.updated_at`,
		f.Partition, f.Path, f.Size, ns(f.ModTime), f.Fingerprint, f.Rows, f.Bad, f.Complete, ns(s.now()))
	if err != nil {
		return fmt.Errorf("record manifest entry of %s: %w", f.Path, err)
	}
	return nil
}

// RejectCounts returns the rejected samples per partition, lane and rule.
func (s *Store) RejectCounts(ctx context.Context) ([]store.RejectCount, error) {
	rows, err := s.query(ctx, `SELECT partition, lane, rule, n FROM stat_rejects
		WHERE n > 0 ORDER BY partition, lane, rule`)
	if err != nil {
		return nil, fmt.Errorf("count rejects: %w", err)
	}
	defer rows.Close()
	var out []store.RejectCount
	for rows.Next() {
		var c store.RejectCount
		if err := rows.Scan(&c.Partition, &c.Lane, &c.Rule, &c.N); err != nil {
			return nil, fmt.Errorf("count rejects: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count rejects: %w", err)
	}
	return out, nil
}

// StatCells returns the per-cell sums kept by the stats triggers.
func (s *Store) StatCells(ctx context.Context) ([]store.StatCell, error) {
	rows, err := s.query(ctx, `SELECT partition, lane, requests, truncated, rejected, with_reasoning, ended,
			prompt_tokens, completion_tokens, reasoning_tokens
		FROM stat_cells WHERE requests > 0 ORDER BY partition, lane`)
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	defer rows.Close()
	var out []store.StatCell
	for rows.Next() {
		var c store.StatCell
		if err := rows.Scan(&c.Partition, &c.Lane, &c.Requests, &c.Truncated, &c.Rejected, &c.WithReasoning, &c.Ended,
			&c.PromptTokens, &c.CompletionTokens, &c.ReasoningTokens); err != nil {
			return nil, fmt.Errorf("read stats: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	return out, nil
}

// EachTokenCount streams the token histograms in primary-key order.
func (s *Store) EachTokenCount(ctx context.Context, fn func(store.TokenCount) error) error {
	rows, err := s.query(ctx, `SELECT partition, lane, kind, tokens, n FROM stat_tokens
		WHERE n > 0 ORDER BY partition, lane, kind, tokens`)
	if err != nil {
		return fmt.Errorf("read token counts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c store.TokenCount
		if err := rows.Scan(&c.Partition, &c.Lane, &c.Kind, &c.Tokens, &c.N); err != nil {
			return fmt.Errorf("read token counts: %w", err)
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read token counts: %w", err)
	}
	return nil
}

// ThroughputHistory returns the answers stored per minute, oldest first.
func (s *Store) ThroughputHistory(ctx context.Context) ([]store.MinuteThroughput, error) {
	out, err := s.throughput(ctx, time.Unix(0, 0), time.Minute,
		`SELECT minute, requests, prompt_tokens, completion_tokens FROM stat_minutes ORDER BY minute`)
	if err != nil {
		return nil, fmt.Errorf("read throughput history: %w", err)
	}
	return out, nil
}

// ThroughputBuckets sums the answers (results and earlier turns) stored
// from start on per bucket.
func (s *Store) ThroughputBuckets(ctx context.Context, start time.Time, bucket time.Duration) ([]store.MinuteThroughput, error) {
	if bucket <= 0 {
		return nil, fmt.Errorf("read throughput buckets: bucket %s is not positive", bucket)
	}
	out, err := s.throughput(ctx, start, bucket, `SELECT b, count(*), coalesce(sum(p), 0), coalesce(sum(c), 0) FROM (
			SELECT (finished_at - ?1) / ?2 AS b, prompt_tokens AS p, completion_tokens AS c FROM results WHERE finished_at >= ?1
			UNION ALL
			SELECT (finished_at - ?1) / ?2, prompt_tokens, completion_tokens FROM turns WHERE finished_at >= ?1)
		GROUP BY b ORDER BY b`, ns(start), int64(bucket))
	if err != nil {
		return nil, fmt.Errorf("read throughput buckets: %w", err)
	}
	return out, nil
}

// throughput reads rows of (bucket number, answers, prompt tokens,
// completion tokens); bucket b starts at start + b*bucket.
func (s *Store) throughput(ctx context.Context, start time.Time, bucket time.Duration, query string, args ...any) ([]store.MinuteThroughput, error) {
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.MinuteThroughput
	for rows.Next() {
		var m store.MinuteThroughput
		var b int64
		if err := rows.Scan(&b, &m.Requests, &m.PromptTokens, &m.CompletionTokens); err != nil {
			return nil, err
		}
		m.Minute = start.Add(time.Duration(b) * bucket)
		out = append(out, m)
	}
	return out, rows.Err()
}

// IngestDuplicates counts the rows skipped for a taken id, with examples.
func (s *Store) IngestDuplicates(ctx context.Context, limit int) (store.Duplicates, error) {
	var d store.Duplicates
	st, err := s.stmt(ctx, `SELECT count(*), coalesce(sum(same_content), 0) FROM ingest_duplicates`)
	if err == nil {
		err = st.QueryRowContext(ctx).Scan(&d.Total, &d.SameContent)
	}
	if err != nil {
		return d, fmt.Errorf("count duplicate ids: %w", err)
	}
	rows, err := s.query(ctx, `SELECT id, partition, origin, first_origin, same_content FROM ingest_duplicates
		ORDER BY origin LIMIT ?`, sqlLimit(limit))
	if err != nil {
		return d, fmt.Errorf("read duplicate ids: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var x store.Duplicate
		if err := rows.Scan(&x.ID, &x.Partition, &x.Origin, &x.FirstOrigin, &x.SameContent); err != nil {
			return d, fmt.Errorf("read duplicate ids: %w", err)
		}
		d.Examples = append(d.Examples, x)
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("read duplicate ids: %w", err)
	}
	return d, nil
}
