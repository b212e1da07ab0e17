package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// States are stored as small integers, their index here (the SQL writes
// them as literals: 0 pending, 1 leased, 2 done, 3 rejected, 4 dead).
var stateNames = [...]store.State{store.Pending, store.Leased, store.Done, store.Rejected, store.Dead}

// stateCode is the stored integer of a state.
func stateCode(st store.State) int16 {
	for i, n := range stateNames {
		if n == st {
			return int16(i)
		}
	}
	panic(fmt.Sprintf("postgres: unknown sample state %q", st))
}

func stateName(v int16) store.State {
	if v >= 0 && int(v) < len(stateNames) {
		return stateNames[v]
	}
	return store.State(fmt.Sprintf("state-%d", v))
}

// Counts sums the sharded count rows into non-empty cells, sorted by
// partition, lane and state name.
func (s *Store) Counts(ctx context.Context) ([]store.Count, error) {
	rows, err := s.pool.Query(ctx, `SELECT partition, lane, state, sum(n) FROM counts
		GROUP BY partition, lane, state HAVING sum(n) > 0`)
	if err != nil {
		return nil, fmt.Errorf("count samples: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Count, error) {
		var c store.Count
		var st int16
		var n int64
		err := row.Scan(&c.Partition, &c.Lane, &st, &n)
		c.State, c.N = stateName(st), int(n)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count samples: %w", err)
	}
	slices.SortFunc(out, func(a, b store.Count) int {
		if c := strings.Compare(a.Partition, b.Partition); c != 0 {
			return c
		}
		if c := strings.Compare(a.Lane, b.Lane); c != 0 {
			return c
		}
		return strings.Compare(string(a.State), string(b.State))
	})
	return out, nil
}

// ThroughputSince sums results (done or rejected) finished at or after t.
func (s *Store) ThroughputSince(ctx context.Context, t time.Time) (store.Throughput, error) {
	var n, ct, pt int64
	var first, last *int64
	// Samples count once finished; tokens count for every stored answer,
	// earlier turns included. Each side reads a covering index.
	err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM results WHERE finished_at >= $1),
			coalesce(sum(completion_tokens), 0), coalesce(sum(prompt_tokens), 0), min(finished_at), max(finished_at)
		FROM (SELECT finished_at, prompt_tokens, completion_tokens FROM results WHERE finished_at >= $1
			UNION ALL
			SELECT finished_at, prompt_tokens, completion_tokens FROM turns WHERE finished_at >= $1) a`, ns(t)).Scan(&n, &ct, &pt, &first, &last)
	if err != nil {
		return store.Throughput{}, fmt.Errorf("throughput since %s: %w", t.Format(time.RFC3339), err)
	}
	tp := store.Throughput{Samples: int(n), CompletionTokens: ct, PromptTokens: pt}
	if first != nil && last != nil {
		tp.First, tp.Last = fromNS(*first), fromNS(*last)
	}
	return tp, nil
}

// Finished calls fn for every done, rejected or dead sample in byte-wise ID
// order, a page at a time, holding no connection while fn runs.
func (s *Store) Finished(ctx context.Context, fn func(store.Row) error) error {
	// ingest refuses empty ids, so every id sorts after "", the first key
	return store.EachPage(pageSize, func(after string) ([]store.Row, string, error) {
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
	rows, err := s.pool.Query(ctx, `SELECT s.id, s.partition, s.lane, s.state, s.body, s.attempts,
			coalesce(s.last_error, ''), s.finished_at,
			r.response, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.endpoint,
			r.duration_ns, r.ttft_ns, r.reason, r.rule, r.turn, r.reasoning_tokens, r.end_reason, r.generation,
			coalesce((SELECT prefix FROM origins WHERE id = s.origin_file), '') || s.origin_pos
		FROM samples s LEFT JOIN results r ON r.sample_id = s.id
		WHERE s.finished_at IS NOT NULL AND s.id > $1
		ORDER BY s.id LIMIT $2`, after, pageSize)
	if err != nil {
		return nil, err
	}
	page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Row, error) {
		var (
			r                 store.Row
			st                int16
			attempts          int32
			lastErr           string
			finishedAt        int64
			response          []byte
			finishReason      *string
			pt, ct, turn, rt  *int32
			gen               *int32
			dur, ttft         *int64
			endpoint          *string
			reason, rule, end *string
		)
		if err := row.Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Body, &attempts, &lastErr, &finishedAt,
			&response, &finishReason, &pt, &ct, &endpoint, &dur, &ttft, &reason, &rule, &turn, &rt, &end, &gen, &r.Origin); err != nil {
			return r, err
		}
		r.State, r.Attempts = stateName(st), int(attempts)
		r.Body = unblob(r.Body)
		r.FinishedAt = fromNS(finishedAt)
		if finishReason != nil {
			r.Result = store.Result{
				Response:         unblob(response),
				FinishReason:     *finishReason,
				PromptTokens:     int(*pt),
				CompletionTokens: int(*ct),
				Endpoint:         *endpoint,
				Duration:         time.Duration(*dur),
				TTFT:             time.Duration(*ttft),
				Turn:             int(*turn),
				ReasoningTokens:  int(*rt),
				EndReason:        *end,
				Generation:       int(*gen),
			}
		}
		switch r.State {
		case store.Rejected:
			if reason != nil {
				r.Reason, r.Rule = *reason, *rule
			}
		case store.Dead:
			r.Reason = lastErr
		}
		return r, nil
	})
	if err != nil {
		return nil, err
	}
	return page, s.attachPrior(ctx, page)
}

// attachPrior reads the earlier turns of the multi-turn rows of a page in
// one query.
func (s *Store) attachPrior(ctx context.Context, page []store.Row) error {
	at := map[string]int{}
	var ids []string
	for i, r := range page {
		if r.Result.Turn > 0 {
			at[r.ID] = i
			ids = append(ids, r.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `SELECT sample_id, `+turnCols+` FROM turns
		WHERE sample_id = ANY($1) ORDER BY sample_id, turn`, ids)
	if err != nil {
		return fmt.Errorf("read earlier turns: %w", err)
	}
	type idTurn struct {
		id string
		r  store.Result
	}
	turns, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idTurn, error) {
		var t idTurn
		r, err := scanTurn(row, &t.id)
		t.r = r
		return t, err
	})
	if err != nil {
		return fmt.Errorf("read earlier turns: %w", err)
	}
	for _, t := range turns {
		if i := at[t.id]; t.r.Turn < page[i].Result.Turn {
			page[i].Prior = append(page[i].Prior, t.r)
		}
	}
	for _, i := range at {
		if got, want := len(page[i].Prior), page[i].Result.Turn; got != want {
			return fmt.Errorf("sample %s: %d earlier turns stored, want %d", page[i].ID, got, want)
		}
	}
	return nil
}

// RejectCounts returns the rejected samples per partition, lane and rule.
func (s *Store) RejectCounts(ctx context.Context) ([]store.RejectCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT partition, lane, rule, sum(n) FROM stat_rejects
		GROUP BY partition, lane, rule HAVING sum(n) > 0 ORDER BY partition COLLATE "C", lane COLLATE "C", rule COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("count rejects: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.RejectCount, error) {
		var c store.RejectCount
		var n int64
		err := row.Scan(&c.Partition, &c.Lane, &c.Rule, &n)
		c.N = int(n)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count rejects: %w", err)
	}
	return out, nil
}

// StatCells returns the per-cell sums over the shards.
func (s *Store) StatCells(ctx context.Context) ([]store.StatCell, error) {
	rows, err := s.pool.Query(ctx, `SELECT partition, lane, sum(requests), sum(truncated), sum(rejected), sum(with_reasoning),
			sum(ended), sum(prompt_tokens), sum(completion_tokens), sum(reasoning_tokens)
		FROM stat_cells GROUP BY partition, lane HAVING sum(requests) > 0
		ORDER BY partition COLLATE "C", lane COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.StatCell, error) {
		var c store.StatCell
		var req, tr, rej, wr, end int64
		err := row.Scan(&c.Partition, &c.Lane, &req, &tr, &rej, &wr, &end, &c.PromptTokens, &c.CompletionTokens, &c.ReasoningTokens)
		c.Requests, c.Truncated, c.Rejected, c.WithReasoning, c.Ended = int(req), int(tr), int(rej), int(wr), int(end)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	return out, nil
}

// EachTokenCount streams the token histograms, summed over the shards.
func (s *Store) EachTokenCount(ctx context.Context, fn func(store.TokenCount) error) error {
	rows, err := s.pool.Query(ctx, `SELECT partition, lane, kind, tokens, sum(n) FROM stat_tokens
		GROUP BY partition, lane, kind, tokens HAVING sum(n) > 0
		ORDER BY partition COLLATE "C", lane COLLATE "C", kind, tokens`)
	if err != nil {
		return fmt.Errorf("read token counts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c store.TokenCount
		var tokens int32
		var n int64
		if err := rows.Scan(&c.Partition, &c.Lane, &c.Kind, &tokens, &n); err != nil {
			return fmt.Errorf("read token counts: %w", err)
		}
		c.Tokens, c.N = int(tokens), int(n)
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
	rows, err := s.pool.Query(ctx, `SELECT minute, sum(requests), sum(prompt_tokens), sum(completion_tokens)
		FROM stat_minutes GROUP BY minute ORDER BY minute`)
	if err != nil {
		return nil, fmt.Errorf("read throughput history: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.MinuteThroughput, error) {
		var m store.MinuteThroughput
		var minute, req int64
		err := row.Scan(&minute, &req, &m.PromptTokens, &m.CompletionTokens)
		m.Minute, m.Requests = time.Unix(minute*60, 0), int(req)
		return m, err
	})
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
	rows, err := s.pool.Query(ctx, `SELECT b, count(*), coalesce(sum(p), 0), coalesce(sum(c), 0) FROM (
			SELECT (finished_at - $1) / $2 AS b, prompt_tokens AS p, completion_tokens AS c FROM results WHERE finished_at >= $1
			UNION ALL
			SELECT (finished_at - $1) / $2, prompt_tokens, completion_tokens FROM turns WHERE finished_at >= $1) a
		GROUP BY b ORDER BY b`, ns(start), int64(bucket))
	if err != nil {
		return nil, fmt.Errorf("read throughput buckets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.MinuteThroughput, error) {
		var m store.MinuteThroughput
		var b, req int64
		err := row.Scan(&b, &req, &m.PromptTokens, &m.CompletionTokens)
		m.Minute, m.Requests = start.Add(time.Duration(b)*bucket), int(req)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("read throughput buckets: %w", err)
	}
	return out, nil
}

// IngestDuplicates counts the rows skipped for a taken id, with examples
// in byte-wise origin order.
func (s *Store) IngestDuplicates(ctx context.Context, limit int) (store.Duplicates, error) {
	var d store.Duplicates
	var total, same int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE same_content) FROM ingest_duplicates`).Scan(&total, &same); err != nil {
		return d, fmt.Errorf("count duplicate ids: %w", err)
	}
	d.Total, d.SameContent = int(total), int(same)
	rows, err := s.pool.Query(ctx, `SELECT id, partition, origin, first_origin, same_content FROM ingest_duplicates
		ORDER BY origin LIMIT $1`, limitArg(limit))
	if err != nil {
		return d, fmt.Errorf("read duplicate ids: %w", err)
	}
	d.Examples, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Duplicate, error) {
		var x store.Duplicate
		err := row.Scan(&x.ID, &x.Partition, &x.Origin, &x.FirstOrigin, &x.SameContent)
		return x, err
	})
	if err != nil {
		return d, fmt.Errorf("read duplicate ids: %w", err)
	}
	return d, nil
}

// LastErrors returns the samples with the most recent retry or dead-letter
// reasons, newest first.
func (s *Store) LastErrors(ctx context.Context, limit int) ([]store.Row, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, partition, lane, state, body, attempts, last_error, coalesce(finished_at, 0)
		FROM samples WHERE last_error_at IS NOT NULL
		ORDER BY last_error_at DESC, seq DESC LIMIT $1`, limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("read last errors: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Row, error) {
		var r store.Row
		var st int16
		var attempts int32
		var finishedAt int64
		err := row.Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Body, &attempts, &r.Reason, &finishedAt)
		r.State, r.Attempts, r.Body, r.FinishedAt = stateName(st), int(attempts), unblob(r.Body), fromNS(finishedAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("read last errors: %w", err)
	}
	return out, nil
}

// PutHeartbeat replaces hb.Owner's heartbeat.
func (s *Store) PutHeartbeat(ctx context.Context, hb store.Heartbeat) error {
	// The heartbeat is how a worker learns its store is gone: it must not
	// wait behind calls stuck on a dead route (in the pool or on a
	// connection) for longer than a dead route takes to fail.
	ctx, cancel := context.WithTimeout(ctx, deadRoute)
	defer cancel()
	_, err := s.pool.Exec(ctx, `INSERT INTO heartbeats (owner, pid, host, time, started, counters)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (owner) DO UPDATE SET pid = excluded.pid, host = excluded.host, time = excluded.time,
			started = excluded.started, counters = excluded.counters`,
		hb.Owner, int32(hb.PID), text(hb.Host), ns(hb.Time), ns(hb.Started), nonNil(hb.Counters))
	if err != nil {
		return fmt.Errorf("put heartbeat of %s: %w", hb.Owner, err)
	}
	return nil
}

const heartbeatCols = `owner, pid, host, time, started, counters`

func scanHeartbeat(row pgx.CollectableRow) (store.Heartbeat, error) {
	var hb store.Heartbeat
	var pid int32
	var t, started int64
	err := row.Scan(&hb.Owner, &pid, &hb.Host, &t, &started, &hb.Counters)
	hb.PID, hb.Time, hb.Started, hb.Counters = int(pid), fromNS(t), fromNS(started), unblob(hb.Counters)
	return hb, err
}

// LastHeartbeat returns the newest heartbeat of any worker.
func (s *Store) LastHeartbeat(ctx context.Context) (store.Heartbeat, bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+heartbeatCols+` FROM heartbeats ORDER BY time DESC LIMIT 1`)
	if err != nil {
		return store.Heartbeat{}, false, fmt.Errorf("read heartbeat: %w", err)
	}
	hb, err := pgx.CollectExactlyOneRow(rows, scanHeartbeat)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Heartbeat{}, false, nil
	}
	if err != nil {
		return store.Heartbeat{}, false, fmt.Errorf("read heartbeat: %w", err)
	}
	return hb, true, nil
}

// Heartbeats returns every worker's latest heartbeat, newest first.
func (s *Store) Heartbeats(ctx context.Context) ([]store.Heartbeat, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+heartbeatCols+` FROM heartbeats ORDER BY time DESC, owner`)
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanHeartbeat)
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	return out, nil
}

// AddEvent appends an event; a zero Time is stamped with the store clock.
func (s *Store) AddEvent(ctx context.Context, e store.Event) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO events (time, kind, subject, state, evidence, worker) VALUES ($1, $2, $3, $4, $5, $6)`,
		ns(e.Time), text(e.Kind), text(e.Subject), text(e.State), text(e.Evidence), text(e.Worker))
	if err != nil {
		return fmt.Errorf("add event %s %s: %w", e.Kind, e.Subject, err)
	}
	return nil
}

// Events returns the newest events first (by insertion).
func (s *Store) Events(ctx context.Context, limit int) ([]store.Event, error) {
	rows, err := s.pool.Query(ctx, `SELECT time, kind, subject, state, evidence, worker FROM events
		ORDER BY id DESC LIMIT $1`, limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Event, error) {
		var e store.Event
		var t int64
		err := row.Scan(&t, &e.Kind, &e.Subject, &e.State, &e.Evidence, &e.Worker)
		e.Time = fromNS(t)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return out, nil
}

// SourceFile returns the manifest entry of path in partition.
func (s *Store) SourceFile(ctx context.Context, partition, path string) (store.SourceFile, bool, error) {
	f := store.SourceFile{Partition: partition, Path: path}
	var mod, rowsN, bad int64
	err := s.pool.QueryRow(ctx, `SELECT size, mod_time, fingerprint, rows, bad, complete FROM source_files
		WHERE partition = $1 AND path = $2`, text(partition), text(path)).
		Scan(&f.Size, &mod, &f.Fingerprint, &rowsN, &bad, &f.Complete)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.SourceFile{}, false, nil
	}
	if err != nil {
		return store.SourceFile{}, false, fmt.Errorf("read manifest entry of %s: %w", path, err)
	}
	f.ModTime, f.Rows, f.Bad = fromNS(mod), int(rowsN), int(bad)
	return f, true, nil
}

// PutSourceFile records f, replacing the entry of its partition and path.
func (s *Store) PutSourceFile(ctx context.Context, f store.SourceFile) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO source_files (partition, path, size, mod_time, fingerprint, rows, bad, complete, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (partition, path) DO UPDATE SET size = excluded.size, mod_time = excluded.mod_time,
			fingerprint = excluded.fingerprint, rows = excluded.rows, bad = excluded.bad,
			complete = excluded.complete, updated_at = excluded.updated_at`,
		text(f.Partition), text(f.Path), f.Size, ns(f.ModTime), text(f.Fingerprint), int64(f.Rows), int64(f.Bad), f.Complete, ns(s.now()))
	if err != nil {
		return fmt.Errorf("record manifest entry of %s: %w", f.Path, err)
	}
	return nil
}
