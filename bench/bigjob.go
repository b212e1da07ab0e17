package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/runner"
	"github.com/regen-dev/regen/internal/source"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// writeTinyJSONL writes n rows of about 38 bytes: the issue's "tiny
// prompts", where the store's own cost per row dominates.
func writeTinyJSONL(path string, n int) (int64, error) {
	return writeJSONL(path, n, func(w io.Writer, i int) {
		fmt.Fprintf(w, `{"id":"r%07d","prompt":"Say hi %d"}`+"\n", i, i%1000)
	})
}

// writeJSONL writes n rows, each written by row, and returns the file's
// size.
func writeJSONL(path string, n int, row func(w io.Writer, i int)) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := range n {
		row(w, i)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, err
	}
	return st.Size(), f.Close()
}

const bigJobYAML = `name: big
model: m
endpoints: [{url: %q, engine: llamacpp}]
sources: [{partition: p, path: %q, prompt: prompt, id: id}]
lanes: [{name: short, concurrency: 64, max_tokens: 16}]
monitor: {hang_after: 1h, stall_after: 1h}
`

// bigSide is one backend's figures.
type bigSide struct {
	ingestRate  float64
	bytesPerRow float64
	rssMiB      float64
	rssOK       bool
	firstReq    time.Duration // first run: ingest and dispatch together
	rerunReq    time.Duration // re-run of the fully ingested job
}

// benchBigJob measures a job of 10^6 tiny prompts (o.bigRows) on both
// backends: first ingest rows/s, store bytes per row and the process's
// peak RSS during it, then the time from opening the store to the first
// request, on the first run and on a re-run.
func benchBigJob(ctx context.Context, o opts) (outcome, error) {
	rows := o.bigRows
	if rows <= 0 {
		rows = 1_000_000
		if o.quick {
			rows = 200_000
		}
	}
	data := filepath.Join(o.dir, "tiny.jsonl")
	size, err := writeTinyJSONL(data, rows)
	if err != nil {
		return outcome{}, err
	}
	defer os.Remove(data)
	ep := newCanned(time.Second)
	defer ep.Close()
	jobPath := filepath.Join(o.dir, "big.yaml")
	if err := os.WriteFile(jobPath, fmt.Appendf(nil, bigJobYAML, ep.URL(), data), 0o644); err != nil {
		return outcome{}, err
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		return outcome{}, err
	}

	floor, err := readFloor(ctx, spec)
	if err != nil {
		return outcome{}, err
	}
	sq, err := bigJobSQLite(ctx, o.dir, spec, rows)
	if err != nil {
		return outcome{}, fmt.Errorf("sqlite: %w", err)
	}
	pg, err := bigJobPostgres(ctx, spec, rows)
	if err != nil {
		return outcome{}, fmt.Errorf("postgres: %w", err)
	}
	tinyRerun, err := tinyJobRerun(ctx, o.dir, spec)
	if err != nil {
		return outcome{}, err
	}
	return bigJobOutcome(rows, size, floor, sq, pg, tinyRerun), nil
}

// bigFloor is the floor of ingest: reading and mapping the file, storing
// nothing.
type bigFloor struct {
	rate     float64
	rssMiB   float64
	rssReset bool
}

func readFloor(ctx context.Context, spec *job.Spec) (bigFloor, error) {
	_, reset := resetPeakRSS()
	rss0 := procStatus("VmRSS")
	s0 := startSpan()
	st, err := source.Read(ctx, spec.Sources[0], "", func(source.Sample) error { return nil }, func(source.BadRow) error { return nil })
	if err != nil {
		return bigFloor{}, err
	}
	return bigFloor{
		rate:     float64(st.Good) / s0.end().wall.Seconds(),
		rssMiB:   float64(peakRSS()-min(rss0, peakRSS())) / mib,
		rssReset: reset,
	}, nil
}

// bigJobSQLite measures the SQLite side in dir; its size is the database
// and its WAL after a checkpoint.
func bigJobSQLite(ctx context.Context, dir string, spec *job.Spec, rows int) (bigSide, error) {
	dbPath := filepath.Join(dir, "big.db")
	open := func() (store.Store, error) { return sqlite.Open(dbPath) }
	freshDB := filepath.Join(dir, "big-first.db")
	openFresh := func() (store.Store, error) { return sqlite.Open(freshDB) }
	return bigJobSide(ctx, spec, rows, open, openFresh, func(s store.Store) (int64, error) {
		if _, err := s.(*sqlite.Store).DB().ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			return 0, err
		}
		var n int64
		for _, p := range []string{dbPath, dbPath + "-wal"} {
			if fi, err := os.Stat(p); err == nil {
				n += fi.Size()
			}
		}
		return n, nil
	})
}

// bigJobPostgres measures the PostgreSQL side; its size is that of the
// schema's tables with their indexes and TOAST.
func bigJobPostgres(ctx context.Context, spec *job.Spec, rows int) (bigSide, error) {
	schema, freshSchema := pgSchema("big"), pgSchema("bigfirst")
	open := func() (store.Store, error) { return pgOpen(ctx, postgres.Options{Schema: schema}) }
	openFresh := func() (store.Store, error) { return pgOpen(ctx, postgres.Options{Schema: freshSchema}) }
	return bigJobSide(ctx, spec, rows, open, openFresh, func(s store.Store) (int64, error) {
		var n int64
		err := s.(*postgres.Store).Pool().QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind = 'r'`, schema).Scan(&n)
		return n, err
	})
}

// tinyJobRerun is the time to first request on a re-run of a 1,000-sample
// job: what starting costs when the job's size plays no part.
func tinyJobRerun(ctx context.Context, dir string, spec *job.Spec) (time.Duration, error) {
	tinyPath := filepath.Join(dir, "tiny1k.jsonl")
	if _, err := writeTinyJSONL(tinyPath, 1000); err != nil {
		return 0, err
	}
	tinySpec := *spec
	tinySpec.Sources = []job.Source{spec.Sources[0]}
	tinySpec.Sources[0].Path = tinyPath
	tinyDB := filepath.Join(dir, "tiny.db")
	open := func() (store.Store, error) { return sqlite.Open(tinyDB) }
	if _, err := firstRequest(ctx, &tinySpec, open); err != nil {
		return 0, err
	}
	return firstRequest(ctx, &tinySpec, open)
}

func bigJobOutcome(rows int, size int64, floor bigFloor, sq, pg bigSide, tinyRerun time.Duration) outcome {
	sec := func(d time.Duration) float64 { return d.Seconds() }
	out := outcome{
		rows: []row{
			{name: "first ingest, sqlite", unit: "rows/s", better: "higher", regen: sq.ingestRate, ref: floor.rate, note: "reading and mapping the file, no store"},
			{name: "first ingest, postgres", unit: "rows/s", better: "higher", regen: pg.ingestRate, ref: floor.rate, note: "reading and mapping the file, no store"},
			{name: "store size, sqlite", unit: "bytes/row", better: "lower", regen: sq.bytesPerRow, ref: float64(size) / float64(rows), note: "source JSONL bytes per row"},
			{name: "store size, postgres", unit: "bytes/row", better: "lower", regen: pg.bytesPerRow, ref: float64(size) / float64(rows), note: "source JSONL bytes per row"},
			{name: "first request, re-run, sqlite", unit: "s", better: "lower", regen: sec(sq.rerunReq), ref: sec(tinyRerun), note: "re-run of a 1,000-sample job, sqlite"},
			{name: "first request, re-run, postgres", unit: "s", better: "lower", regen: sec(pg.rerunReq), ref: sec(tinyRerun), note: "re-run of a 1,000-sample job, sqlite"},
			{name: "first request, first run, sqlite", unit: "s", better: "lower", regen: sec(sq.firstReq), ref: sec(tinyRerun), note: "re-run of a 1,000-sample job, sqlite"},
			{name: "first request, first run, postgres", unit: "s", better: "lower", regen: sec(pg.firstReq), ref: sec(tinyRerun), note: "re-run of a 1,000-sample job, sqlite"},
		},
		detail: []string{fmt.Sprintf("%d rows, %.1f MiB JSONL (%.0f bytes/row); first run = ingest and dispatch together from an empty store; time to first request counts from opening the store", rows, float64(size)/mib, float64(size)/float64(rows))},
	}
	if sq.rssOK && pg.rssOK && floor.rssReset {
		const note = "reading and mapping the file, no store (VmHWM reset per side)"
		out.rows = append(out.rows,
			row{name: "ingest peak RSS, sqlite", unit: "MiB above start", better: "lower", regen: sq.rssMiB, ref: floor.rssMiB, note: note},
			row{name: "ingest peak RSS, postgres", unit: "MiB above start", better: "lower", regen: pg.rssMiB, ref: floor.rssMiB, note: note + "; server memory not counted"})
	} else {
		out.detail = append(out.detail, peakRSSUnavailable())
	}
	return out
}

// bigJobSide ingests the job into the store open opens (measured), then
// measures the first request of a re-run, and of a first run in the empty
// store openFresh opens.
func bigJobSide(ctx context.Context, spec *job.Spec, rows int, open, openFresh func() (store.Store, error), size func(store.Store) (int64, error)) (bigSide, error) {
	var side bigSide
	st, err := open()
	if err != nil {
		return side, err
	}
	_, reset := resetPeakRSS()
	rss0 := procStatus("VmRSS")
	s0 := startSpan()
	stats, err := runner.Ingest(ctx, spec, st)
	wall := s0.end().wall
	side.rssMiB, side.rssOK = float64(peakRSS()-min(rss0, peakRSS()))/mib, reset
	if err != nil {
		st.Close()
		return side, err
	}
	if stats.Inserted != rows {
		st.Close()
		return side, fmt.Errorf("ingested %d new samples, want %d", stats.Inserted, rows)
	}
	side.ingestRate = float64(rows) / wall.Seconds()
	n, err := size(st)
	st.Close()
	if err != nil {
		return side, fmt.Errorf("store size: %w", err)
	}
	side.bytesPerRow = float64(n) / float64(rows)
	if side.rerunReq, err = firstRequest(ctx, spec, open); err != nil {
		return side, fmt.Errorf("re-run: %w", err)
	}
	if side.firstReq, err = firstRequest(ctx, spec, openFresh); err != nil {
		return side, fmt.Errorf("first run: %w", err)
	}
	return side, nil
}

// firstRequest runs the job from opening its store until the endpoint sees
// its first request, then interrupts the run.
func firstRequest(ctx context.Context, spec *job.Spec, open func() (store.Store, error)) (time.Duration, error) {
	ep := newCanned(time.Second)
	defer ep.Close()
	sp := *spec
	sp.Endpoints = []job.Endpoint{{URL: ep.URL(), Engine: "llamacpp"}}
	t0 := time.Now()
	st, err := open()
	if err != nil {
		return 0, err
	}
	defer st.Close()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runner.Run(runCtx, runner.Options{Spec: &sp, Store: st, NoExport: true, DrainTimeout: 100 * time.Millisecond, ProgressEvery: time.Hour})
		done <- err
	}()
	select {
	case t := <-ep.first:
		cancel()
		<-done
		return t.Sub(t0), nil
	case err := <-done:
		return 0, fmt.Errorf("run ended before any request: %w", err)
	case <-time.After(10 * time.Minute):
		cancel()
		<-done
		return 0, errors.New("no request within 10 minutes")
	}
}
