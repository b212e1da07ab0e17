package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// scaleRun is one measured run of N dispatchers.
type scaleRun struct {
	rate  float64 // samples per second, all workers together
	span  span
	pgCPU time.Duration // the database server's CPU over the run
}

// runWorkers ingests samples into the store opened by open(0), then runs
// n dispatchers (each with a store handle of its own, as separate processes
// would have, and an endpoint of its own) until every sample is done.
func runWorkers(ctx context.Context, n, samples, conc int, latency time.Duration, open func(i int) (store.Store, error)) (scaleRun, error) {
	stores := make([]store.Store, n)
	defer func() {
		for _, st := range stores {
			if st != nil {
				st.Close()
			}
		}
	}()
	for i := range n {
		st, err := open(i)
		if err != nil {
			return scaleRun{}, err
		}
		stores[i] = st
	}
	batch := make([]store.NewSample, 0, 1000)
	for i := range samples {
		batch = append(batch, store.NewSample{ID: fmt.Sprintf("s%08d", i), Partition: "p", Lane: "short",
			Body: fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Say hello %d"}]}`, i), PromptTokens: 9, Origin: fmt.Sprintf("p.jsonl:%d", i+1)})
		if len(batch) == cap(batch) || i == samples-1 {
			if _, err := stores[0].Ingest(ctx, batch); err != nil {
				return scaleRun{}, fmt.Errorf("ingest: %w", err)
			}
			batch = batch[:0]
		}
	}
	ds := make([]*dispatch.Dispatcher, n)
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	for i := range n {
		ep := newCanned(latency)
		client := llm.New(llm.Config{BaseURL: ep.URL(), MaxConns: conc})
		closers = append(closers, ep.Close, client.Close)
		d, err := dispatch.New(dispatch.Config{
			Store: stores[i], Owner: fmt.Sprintf("worker-%d", i), Model: "m",
			Lanes:     []dispatch.LaneConfig{{Name: "short", Concurrency: conc, MaxTokens: 16}},
			Endpoints: []dispatch.Endpoint{{URL: ep.URL(), Client: client}},
		})
		if err != nil {
			return scaleRun{}, err
		}
		ds[i] = d
	}
	s0 := startSpan()
	pg0 := pgCPU()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() { errs[i] = d.Run(ctx) })
	}
	wg.Wait()
	sp := s0.end()
	pgUsed := pgCPU() - pg0
	var done int64
	for i, d := range ds {
		if errs[i] != nil {
			return scaleRun{}, fmt.Errorf("worker %d: %w", i, errs[i])
		}
		done += d.Snapshot().Counters.Done
	}
	if done != int64(samples) {
		return scaleRun{}, fmt.Errorf("workers finished %d samples, want %d", done, samples)
	}
	return scaleRun{rate: float64(samples) / sp.wall.Seconds(), span: sp, pgCPU: pgUsed}, nil
}

// plainRate is the same endpoint driven by conc plain Chat loops that keep
// nothing: what one process does without a store and a dispatcher.
func plainRate(ctx context.Context, samples, conc int, latency time.Duration) (scaleRun, error) {
	ep := newCanned(latency)
	defer ep.Close()
	client := llm.New(llm.Config{BaseURL: ep.URL(), MaxConns: conc})
	defer client.Close()
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	s0 := startSpan()
	for range conc {
		wg.Go(func() {
			for i := range next {
				body := fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Say hello %d"}]}`, i)
				if _, err := client.Chat(ctx, llm.Request{Model: "m", Body: json.RawMessage(body), MaxTokens: 16}, func(int) {}); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		})
	}
	for i := range samples {
		next <- i
	}
	close(next)
	wg.Wait()
	sp := s0.end()
	if firstErr != nil {
		return scaleRun{}, firstErr
	}
	return scaleRun{rate: float64(samples) / sp.wall.Seconds(), span: sp}, nil
}

// benchScale measures completions per second end to end (claim, request,
// commit) with short answers: one process at full speed on each backend,
// with and without group commit; 1, 2 and 4 workers on one PostgreSQL store,
// each bound by its own endpoint, against 1 on SQLite; and the latency of a
// claim in a store of 10^6 pending samples.
func benchScale(ctx context.Context, o opts) (outcome, error) {
	perWorker, peakSamples, claimRows := 3000, 20000, 1_000_000
	if o.quick {
		perWorker, peakSamples, claimRows = 1000, 6000, 200_000
	}
	stores := scaleStores{ctx: ctx, dir: o.dir}
	one, err := scaleOneProcess(ctx, stores, peakSamples)
	if err != nil {
		return outcome{}, err
	}
	workers, err := scaleWorkers(ctx, stores, perWorker)
	if err != nil {
		return outcome{}, err
	}
	claim, err := claimLatency(ctx, o, claimRows)
	if err != nil {
		return outcome{}, err
	}
	var out outcome
	for _, p := range []outcome{one, workers, claim} {
		out.rows = append(out.rows, p.rows...)
		out.detail = append(out.detail, p.detail...)
	}
	return out, nil
}

// scaleStores opens the scale case's stores: SQLite files in dir and one
// PostgreSQL schema per opener, with a commit batch (0 = the default).
type scaleStores struct {
	ctx context.Context
	dir string
}

func (s scaleStores) sqlite(name string, batch int) func(int) (store.Store, error) {
	return func(int) (store.Store, error) {
		return sqlite.OpenWith(filepath.Join(s.dir, name), sqlite.Options{CommitBatch: batch})
	}
}

func (s scaleStores) postgres(batch int) func(int) (store.Store, error) {
	schema := pgSchema("scale")
	return func(int) (store.Store, error) {
		return pgOpen(s.ctx, postgres.Options{Schema: schema, CommitBatch: batch})
	}
}

// cpuPerSample is the CPU per sample in this process; dbCPUPerSample that
// in the database server, in µs.
func cpuPerSample(r scaleRun, n int) float64   { return float64(r.span.cpu.Microseconds()) / float64(n) }
func dbCPUPerSample(r scaleRun, n int) float64 { return float64(r.pgCPU.Microseconds()) / float64(n) }

// scaleOneProcess runs one process as fast as it goes (a short latency
// and many slots) on each backend, with group commit and with one
// transaction per completion, against plain Chat loops with no store.
func scaleOneProcess(ctx context.Context, stores scaleStores, peakSamples int) (outcome, error) {
	const peakConc, peakLatency = 512, 10 * time.Millisecond
	peak := map[string]scaleRun{}
	for _, c := range []struct {
		name string
		open func(int) (store.Store, error)
	}{
		{"sqlite", stores.sqlite("peak.db", 0)},
		{"sqlite-1tx", stores.sqlite("peak1.db", 1)},
		{"postgres", stores.postgres(0)},
		{"postgres-1tx", stores.postgres(1)},
	} {
		r, err := runWorkers(ctx, 1, peakSamples, peakConc, peakLatency, c.open)
		if err != nil {
			return outcome{}, fmt.Errorf("peak %s: %w", c.name, err)
		}
		peak[c.name] = r
	}
	plain, err := plainRate(ctx, peakSamples, peakConc, peakLatency)
	if err != nil {
		return outcome{}, fmt.Errorf("plain chat loops: %w", err)
	}
	return outcome{
		rows: []row{
			{name: "one process, sqlite", unit: "samples/s", better: "higher", regen: peak["sqlite"].rate, ref: plain.rate, note: "same endpoint, plain Chat loops, no store"},
			{name: "one process, postgres", unit: "samples/s", better: "higher", regen: peak["postgres"].rate, ref: plain.rate, note: "same endpoint, plain Chat loops, no store"},
			{name: "group commit, sqlite", unit: "samples/s", better: "higher", regen: peak["sqlite"].rate, ref: peak["sqlite-1tx"].rate, note: "sqlite, one transaction per completion"},
			{name: "group commit, postgres", unit: "samples/s", better: "higher", regen: peak["postgres"].rate, ref: peak["postgres-1tx"].rate, note: "postgres, one transaction per completion"},
			{name: "one process CPU, postgres", unit: "cpu-µs/sample", better: "lower", regen: cpuPerSample(peak["postgres"], peakSamples), ref: cpuPerSample(plain, peakSamples), note: "plain Chat loops (client and endpoint CPU on both sides)"},
		},
		detail: []string{fmt.Sprintf("one process: %d samples, lane concurrency %d, endpoint latency %s, 3-token answers; PostgreSQL with fsync on (results wait for the WAL flush); CPU per sample: sqlite %.0f µs, postgres %.0f µs here + %.0f µs in the database server, plain loops %.0f µs",
			peakSamples, peakConc, peakLatency, cpuPerSample(peak["sqlite"], peakSamples), cpuPerSample(peak["postgres"], peakSamples), dbCPUPerSample(peak["postgres"], peakSamples), cpuPerSample(plain, peakSamples))},
	}, nil
}

// scaleWorkers runs 1, 2 and 4 workers on PostgreSQL, each bound by its
// endpoint (as a worker is by its GPUs), at a pace that leaves the shared
// cores room for four: scaling is then what the store allows.
func scaleWorkers(ctx context.Context, stores scaleStores, perWorker int) (outcome, error) {
	const conc, latency = 32, 100 * time.Millisecond
	sq, err := runWorkers(ctx, 1, perWorker, conc, latency, stores.sqlite("scale.db", 0))
	if err != nil {
		return outcome{}, fmt.Errorf("sqlite 1 worker: %w", err)
	}
	pg := map[int]scaleRun{}
	for _, n := range []int{1, 2, 4} {
		r, err := runWorkers(ctx, n, n*perWorker, conc, latency, stores.postgres(0))
		if err != nil {
			return outcome{}, fmt.Errorf("postgres %d workers: %w", n, err)
		}
		pg[n] = r
	}
	ideal := float64(conc) / latency.Seconds()
	return outcome{
		rows: []row{
			{name: "1 worker postgres", unit: "samples/s", better: "higher", regen: pg[1].rate, ref: sq.rate, note: "1 worker on sqlite"},
			{name: "2 workers postgres", unit: "samples/s", better: "higher", regen: pg[2].rate, ref: 2 * pg[1].rate, note: "2 x 1 worker on postgres (linear)"},
			{name: "4 workers postgres", unit: "samples/s", better: "higher", regen: pg[4].rate, ref: 4 * pg[1].rate, note: "4 x 1 worker on postgres (linear)"},
		},
		detail: []string{fmt.Sprintf("workers: %d samples each, lane concurrency %d, endpoint latency %s (at most %.0f samples/s per worker); each worker its own store handle and endpoint, all in this process on the same cores as PostgreSQL; CPU per sample here + in the database: %.0f + %.0f µs (1 worker), %.0f + %.0f µs (4 workers)",
			perWorker, conc, latency, ideal, cpuPerSample(pg[1], perWorker), dbCPUPerSample(pg[1], perWorker), cpuPerSample(pg[4], 4*perWorker), dbCPUPerSample(pg[4], 4*perWorker))},
	}, nil
}

// claimLatency times Claim(64) in stores holding rows pending samples.
func claimLatency(ctx context.Context, o opts, rows int) (outcome, error) {
	const claims, n = 200, 64
	measure := func(st store.Store) ([]time.Duration, error) {
		batch := make([]store.NewSample, 0, 5000)
		for i := range rows {
			batch = append(batch, store.NewSample{ID: fmt.Sprintf("c%08d", i), Partition: "p", Lane: "short",
				Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`), PromptTokens: 3, Origin: "p.jsonl"})
			if len(batch) == cap(batch) || i == rows-1 {
				if _, err := st.Ingest(ctx, batch); err != nil {
					return nil, err
				}
				batch = batch[:0]
			}
		}
		var ds []time.Duration
		for i := range claims {
			t0 := time.Now()
			c, err := st.Claim(ctx, "short", n, fmt.Sprintf("w%d", i%4), time.Minute)
			ds = append(ds, time.Since(t0))
			if err != nil {
				return nil, err
			}
			if len(c) != n {
				return nil, fmt.Errorf("claimed %d, want %d", len(c), n)
			}
		}
		slices.Sort(ds)
		return ds, nil
	}
	sq, err := sqlite.Open(filepath.Join(o.dir, "claims.db"))
	if err != nil {
		return outcome{}, err
	}
	sqd, err := measure(sq)
	sq.Close()
	if err != nil {
		return outcome{}, fmt.Errorf("sqlite claims: %w", err)
	}
	pg, err := pgOpen(ctx, postgres.Options{Schema: pgSchema("claims")})
	if err != nil {
		return outcome{}, err
	}
	pgd, err := measure(pg)
	pg.Close()
	if err != nil {
		return outcome{}, fmt.Errorf("postgres claims: %w", err)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	p := func(ds []time.Duration, q float64) time.Duration { return ds[int(q*float64(len(ds)-1))] }
	return outcome{
		rows: []row{
			{name: "claim p50, postgres", unit: "ms per Claim(64)", better: "lower", regen: ms(p(pgd, 0.5)), ref: ms(p(sqd, 0.5)), note: "sqlite, same store size"},
			{name: "claim p99, postgres", unit: "ms per Claim(64)", better: "lower", regen: ms(p(pgd, 0.99)), ref: ms(p(sqd, 0.99)), note: "sqlite, same store size"},
		},
		detail: []string{fmt.Sprintf("claims: %d x Claim(64) from %d pending samples (ingest untimed)", claims, rows)},
	}, nil
}
