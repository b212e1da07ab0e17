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

var stateNames = [...]store.State{store.Pending, store.Leased, store.Done, store.Rejected, store.Dead}

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
	err := s.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(completion_tokens), 0), coalesce(sum(prompt_tokens), 0),
			min(finished_at), max(finished_at)
		FROM results WHERE finished_at >= $1`, ns(t)).Scan(&n, &ct, &pt, &first, &last)
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
	after := "" // ingest refuses empty ids, so every id sorts after ""
	for {
		page, err := s.finishedPage(ctx, after)
		if err != nil {
			return fmt.Errorf("read finished samples after %q: %w", after, err)
		}
		for _, r := range page {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(page) < pageSize {
			return nil
		}
		after = page[len(page)-1].ID
	}
}

func (s *Store) finishedPage(ctx context.Context, after string) ([]store.Row, error) {
	rows, err := s.pool.Query(ctx, `SELECT s.id, s.partition, s.lane, s.state, s.body, s.attempts,
			coalesce(s.last_error, ''), s.finished_at,
			r.response, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.endpoint,
			r.duration_ns, r.ttft_ns, r.reason
		FROM samples s LEFT JOIN results r ON r.sample_id = s.id
		WHERE s.finished_at IS NOT NULL AND s.id > $1
		ORDER BY s.id LIMIT $2`, after, pageSize)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Row, error) {
		var (
			r            store.Row
			st           int16
			attempts     int32
			lastErr      string
			finishedAt   int64
			response     []byte
			finishReason *string
			pt, ct       *int32
			dur, ttft    *int64
			endpoint     *string
			reason       *string
		)
		if err := row.Scan(&r.ID, &r.Partition, &r.Lane, &st, &r.Body, &attempts, &lastErr, &finishedAt,
			&response, &finishReason, &pt, &ct, &endpoint, &dur, &ttft, &reason); err != nil {
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
			}
		}
		switch r.State {
		case store.Rejected:
			if reason != nil {
				r.Reason = *reason
			}
		case store.Dead:
			r.Reason = lastErr
		}
		return r, nil
	})
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
