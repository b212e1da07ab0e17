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
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("q", 200) + `"}]}`)
	ingested := 0
	ingest := func(n int) error {
		batch := make([]store.NewSample, 0, 1000)
		for range n {
			batch = append(batch, store.NewSample{ID: fmt.Sprintf("p/%09d", ingested), Partition: "p", Lane: "short", Body: body, PromptTokens: 60, Origin: fmt.Sprintf("p.jsonl:%d", ingested+1)})
			ingested++
			if len(batch) == cap(batch) {
				if _, err := s.Ingest(ctx, batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			_, err := s.Ingest(ctx, batch)
			return err
		}
		return nil
	}
	res := store.Result{Response: storeResponse, FinishReason: "stop", PromptTokens: 60, CompletionTokens: 250, Endpoint: "http://127.0.0.1:30000", Duration: 3 * time.Second, TTFT: 200 * time.Millisecond}
	// regenWindow runs Claim(64) + Complete each for about d; ingesting more
	// samples when the store runs dry happens outside the measured time.
	regenWindow := func(d time.Duration) (int, span, error) {
		var total span
		n := 0
		for total.wall < d {
			s0 := startSpan()
			cs, err := s.Claim(ctx, "short", 64, "bench", time.Hour)
			if err != nil {
				return 0, span{}, err
			}
			for _, c := range cs {
				if err := s.Complete(ctx, c.ID, "bench", res); err != nil {
					return 0, span{}, err
				}
			}
			sp := s0.end()
			if len(cs) == 0 {
				if err := ingest(20000); err != nil {
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

	db, err := openRawSQLite(filepath.Join(o.dir, "raw.db"))
	if err != nil {
		return outcome{}, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE results (id TEXT PRIMARY KEY, response BLOB NOT NULL)`); err != nil {
		return outcome{}, fmt.Errorf("reference schema: %w", err)
	}
	ins, err := db.PrepareContext(ctx, `INSERT OR REPLACE INTO results (id, response) VALUES (?, ?)`)
	if err != nil {
		return outcome{}, fmt.Errorf("reference prepare: %w", err)
	}
	defer ins.Close()
	refN := 0
	refWindow := func(d time.Duration) (int, span, error) {
		s0 := startSpan()
		n := 0
		for time.Since(s0.t) < d {
			for range 64 {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return 0, span{}, err
				}
				if _, err := tx.StmtContext(ctx, ins).ExecContext(ctx, fmt.Sprintf("p/%09d", refN), storeResponse); err != nil {
					tx.Rollback()
					return 0, span{}, err
				}
				if err := tx.Commit(); err != nil {
					return 0, span{}, err
				}
				refN++
				n++
			}
		}
		return n, s0.end(), nil
	}

	if err := ingest(20000); err != nil {
		return outcome{}, fmt.Errorf("ingest: %w", err)
	}
	// Warm up both (page cache, prepared statements, WAL growth).
	if _, _, err := regenWindow(100 * time.Millisecond); err != nil {
		return outcome{}, fmt.Errorf("warm-up: %w", err)
	}
	if _, _, err := refWindow(100 * time.Millisecond); err != nil {
		return outcome{}, fmt.Errorf("reference warm-up: %w", err)
	}
	var rate, cpu [2]float64
	for r := range rounds {
		for i, fn := range []func(time.Duration) (int, span, error){regenWindow, refWindow} {
			n, sp, err := fn(window)
			if err != nil {
				return outcome{}, err
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
	const note = "raw INSERT OR REPLACE of 1 KB, 1 per tx, same driver+pragmas"
	return outcome{
		rows: []row{
			{name: "store commits", unit: "completions/s", better: "higher", regen: rate[0], ref: rate[1], note: note},
			{name: "store commit CPU", unit: "cpu-µs/completion", better: "lower", regen: cpu[0], ref: cpu[1], note: note},
		},
		detail: []string{fmt.Sprintf("Claim(64) then Complete each with a 1 KB response; %.1f s windows, best of %d; %d samples ingested (untimed)", window.Seconds(), rounds, ingested)},
	}, nil
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
