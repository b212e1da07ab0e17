package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the driver regen's store uses

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// storeResponse is a 1 KB response record, the size of a short answer.
var storeResponse = []byte(`{"content":"` + strings.Repeat("x", 1000) + `"}`)

// benchStore compares completions committed per second through the store's
// claim/complete cycle with one raw INSERT OR REPLACE of the same 1 KB per
// transaction on the same driver, pragmas and connection setup: the
// durability every completion must pay for.
func benchStore(ctx context.Context, o opts) (outcome, error) {
	window, rounds := 1500*time.Millisecond, 2
	if o.quick {
		window, rounds = 700*time.Millisecond, 1
	}

	s, err := sqlite.Open(filepath.Join(o.dir, "store.db"))
	if err != nil {
		return outcome{}, err
	}
	defer s.Close()
	rg := &storeCycle{ctx: ctx, s: s}
	ref, err := openRawInserts(ctx, filepath.Join(o.dir, "raw.db"))
	if err != nil {
		return outcome{}, err
	}
	defer ref.Close()

	if err := rg.ingest(20000); err != nil {
		return outcome{}, fmt.Errorf("ingest: %w", err)
	}
	// Warm up both (page cache, prepared statements, WAL growth).
	if _, _, err := rg.window(100 * time.Millisecond); err != nil {
		return outcome{}, fmt.Errorf("warm-up: %w", err)
	}
	if _, _, err := ref.window(100 * time.Millisecond); err != nil {
		return outcome{}, fmt.Errorf("reference warm-up: %w", err)
	}
	rate, cpu, err := bestCommitWindows(rounds, window, rg.window, ref.window)
	if err != nil {
		return outcome{}, err
	}
	const note = "raw INSERT OR REPLACE of 1 KB, 1 per tx, same driver+pragmas"
	return outcome{
		rows: []row{
			{name: "store commits", unit: "completions/s", better: "higher", regen: rate[0], ref: rate[1], note: note},
			{name: "store commit CPU", unit: "cpu-µs/completion", better: "lower", regen: cpu[0], ref: cpu[1], note: note},
		},
		detail: []string{fmt.Sprintf("Claim(64) then Complete each with a 1 KB response; %.1f s windows, best of %d; %d samples ingested (untimed)", window.Seconds(), rounds, rg.ingested)},
	}, nil
}

// commitWindow commits for about d and returns how many commits it made
// and the time they took.
type commitWindow func(d time.Duration) (int, span, error)

// bestCommitWindows runs regen's and the reference's windows alternately
// for rounds and keeps each side's best rate (commits/s) and CPU
// (cpu-µs/commit): other tenants of the machine only ever add time.
func bestCommitWindows(rounds int, d time.Duration, regen, ref commitWindow) (rate, cpu [2]float64, err error) {
	for r := range rounds {
		for i, fn := range []commitWindow{regen, ref} {
			n, sp, err := fn(d)
			if err != nil {
				return rate, cpu, err
			}
			rt := float64(n) / sp.wall.Seconds()
			c := float64(sp.cpu.Microseconds()) / float64(n)
			if r == 0 || rt > rate[i] {
				rate[i] = rt
			}
			if r == 0 || c < cpu[i] {
				cpu[i] = c
			}
		}
	}
	return rate, cpu, nil
}

// storeCycle is regen's side: samples ingested into a store, then claimed
// and completed.
type storeCycle struct {
	ctx      context.Context
	s        *sqlite.Store
	ingested int
}

var storeBody = []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("q", 200) + `"}]}`)

var storeResult = store.Result{Response: storeResponse, FinishReason: "stop", PromptTokens: 60, CompletionTokens: 250, Endpoint: "http://127.0.0.1:30000", Duration: 3 * time.Second, TTFT: 200 * time.Millisecond}

// ingest adds n more samples in batches of 1000.
func (c *storeCycle) ingest(n int) error {
	batch := make([]store.NewSample, 0, 1000)
	for range n {
		batch = append(batch, store.NewSample{ID: fmt.Sprintf("p/%09d", c.ingested), Partition: "p", Lane: "short", Body: storeBody, PromptTokens: 60, Origin: fmt.Sprintf("p.jsonl:%d", c.ingested+1)})
		c.ingested++
		if len(batch) == cap(batch) {
			if _, err := c.s.Ingest(c.ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		_, err := c.s.Ingest(c.ctx, batch)
		return err
	}
	return nil
}

// window runs Claim(64) + Complete each for about d; ingesting more
// samples when the store runs dry happens outside the measured time.
func (c *storeCycle) window(d time.Duration) (int, span, error) {
	var total span
	n := 0
	for total.wall < d {
		s0 := startSpan()
		cs, err := c.s.Claim(c.ctx, "short", 64, "bench", time.Hour)
		if err != nil {
			return 0, span{}, err
		}
		for _, cl := range cs {
			if err := c.s.Complete(c.ctx, cl.ID, "bench", storeResult); err != nil {
				return 0, span{}, err
			}
		}
		sp := s0.end()
		if len(cs) == 0 {
			if err := c.ingest(20000); err != nil {
				return 0, span{}, err
			}
			continue
		}
		total.wall += sp.wall
		total.cpu += sp.cpu
		n += len(cs)
	}
	return n, total, nil
}

// rawInserts is the reference side: one INSERT OR REPLACE per transaction.
type rawInserts struct {
	ctx context.Context
	db  *sql.DB
	ins *sql.Stmt
	n   int
}

func openRawInserts(ctx context.Context, path string) (*rawInserts, error) {
	db, err := openRawSQLite(path)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE results (id TEXT PRIMARY KEY, response BLOB NOT NULL)`); err != nil {
		db.Close()
		return nil, fmt.Errorf("reference schema: %w", err)
	}
	ins, err := db.PrepareContext(ctx, `INSERT OR REPLACE INTO results (id, response) VALUES (?, ?)`)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("reference prepare: %w", err)
	}
	return &rawInserts{ctx: ctx, db: db, ins: ins}, nil
}

func (r *rawInserts) Close() error {
	r.ins.Close()
	return r.db.Close()
}

// window commits 64 inserts at a time for about d.
func (r *rawInserts) window(d time.Duration) (int, span, error) {
	s0 := startSpan()
	n := 0
	for time.Since(s0.t) < d {
		for range 64 {
			if err := r.insert(); err != nil {
				return 0, span{}, err
			}
			n++
		}
	}
	return n, s0.end(), nil
}

func (r *rawInserts) insert() error {
	tx, err := r.db.BeginTx(r.ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.StmtContext(r.ctx, r.ins).ExecContext(r.ctx, fmt.Sprintf("p/%09d", r.n), storeResponse); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	r.n++
	return nil
}

// openRawSQLite opens path the way internal/store/sqlite does: WAL,
// synchronous NORMAL, the same busy timeout and foreign keys, immediate
// transactions and one connection.
func openRawSQLite(path string) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open reference db: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("open reference db: journal mode %q, %v", mode, err)
	}
	return db, nil
}
