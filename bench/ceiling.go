package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres"
)

// The ceiling case runs 1, 4, 16 and 32 worker processes (this binary
// again, with -ceiling-worker) on one PostgreSQL job, each a dispatcher
// with its own store pool and its own canned endpoint answering 3 tokens
// after a short latency, so the store is what the workers wait for. It
// reports the samples per second of all of them together, what a Claim and
// a Commit cost their caller (p50, p99), the database's CPU and
// connections, and from pg_stat_statements the database time per sample
// of each statement.

// ceilingArgs configures one worker process.
type ceilingArgs struct {
	DSN, Schema, Owner string
	Conc               int
	Latency            time.Duration
}

// ceilingReport is what a worker process prints when its lane is empty.
type ceilingReport struct {
	Done           int64
	First, Last    time.Time       // its first claim, its last commit
	Claims, Commit []time.Duration // every Claim and Commit call, as its caller waited
}

// timedStore times the two calls a worker makes per sample.
type timedStore struct {
	store.Store
	mu             sync.Mutex
	first, last    time.Time
	claims, commit []time.Duration
}

func (s *timedStore) Claim(ctx context.Context, lane string, n int, owner string, lease time.Duration) ([]store.Claimed, error) {
	return s.ClaimKept(ctx, lane, n, owner, lease, nil)
}

func (s *timedStore) ClaimKept(ctx context.Context, lane string, n int, owner string, lease time.Duration, kept []store.Kept) ([]store.Claimed, error) {
	t0 := time.Now()
	c, err := s.Store.ClaimKept(ctx, lane, n, owner, lease, kept)
	d := time.Since(t0)
	s.mu.Lock()
	if s.first.IsZero() {
		s.first = t0
	}
	s.claims = append(s.claims, d)
	s.mu.Unlock()
	return c, err
}

func (s *timedStore) Commit(ctx context.Context, t store.Transition) error {
	t0 := time.Now()
	err := s.Store.Commit(ctx, t)
	s.mu.Lock()
	s.commit = append(s.commit, time.Since(t0))
	s.last = time.Now()
	s.mu.Unlock()
	return err
}

// ceilingWorker is the worker process: it runs one dispatcher until the
// lane is empty, beating every 2 s as a runner would, and prints its report.
func ceilingWorker(arg string) error {
	var a ceilingArgs
	if err := json.Unmarshal([]byte(arg), &a); err != nil {
		return fmt.Errorf("worker arguments: %w", err)
	}
	ctx := context.Background()
	st, err := postgres.Open(ctx, a.DSN, postgres.Options{Schema: a.Schema})
	if err != nil {
		return err
	}
	defer st.Close()
	ts := &timedStore{Store: st}
	ep := newCanned(a.Latency)
	defer ep.Close()
	client := llm.New(llm.Config{BaseURL: ep.URL(), MaxConns: a.Conc})
	defer client.Close()
	d, err := dispatch.New(dispatch.Config{Store: ts, Owner: a.Owner, Model: "m",
		Lanes:     []dispatch.LaneConfig{{Name: "short", Concurrency: a.Conc, MaxTokens: 16}},
		Endpoints: []dispatch.Endpoint{{URL: ep.URL(), Client: client}}})
	if err != nil {
		return err
	}
	beatCtx, stopBeat := context.WithCancel(ctx)
	defer stopBeat()
	go func() {
		host, _ := os.Hostname()
		started := time.Now()
		for {
			_ = st.PutHeartbeat(beatCtx, store.Heartbeat{Owner: a.Owner, PID: os.Getpid(), Host: host, Time: time.Now(), Started: started, Counters: []byte(`{}`)})
			select {
			case <-beatCtx.Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
	if err := d.Run(ctx); err != nil {
		return err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return json.NewEncoder(os.Stdout).Encode(ceilingReport{Done: d.Snapshot().Counters.Done, First: ts.first, Last: ts.last, Claims: ts.claims, Commit: ts.commit})
}

// ceilingRun is the measurement of one worker count.
type ceilingRun struct {
	workers, samples int
	rate             float64
	claims, commits  []time.Duration
	dbCPU, cliCPU    time.Duration
	wall             time.Duration
	conns            int
	statements       []stmtCost
	bytes            map[string]int64 // table and its indexes, on disk
}

// stmtCost is one statement kind's database time over a run.
type stmtCost struct {
	kind  string
	calls int64
	total time.Duration
}

func benchCeiling(ctx context.Context, o opts) (outcome, error) {
	counts, perWorker, least := []int{1, 4, 16, 32}, 500, 4000
	if o.quick {
		counts, perWorker, least = []int{1, 4, 16}, 200, 2000
	}
	const conc, latency = 32, 20 * time.Millisecond
	dsn, err := pgStart(ctx)
	if err != nil {
		return outcome{}, err
	}
	if err := pgServer.Exec(ctx, "regen_bench", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return outcome{}, fmt.Errorf("pg_stat_statements: %w", err)
	}
	var runs []ceilingRun
	for _, n := range counts {
		samples := max(least, n*perWorker)
		r, err := ceilingOnce(ctx, dsn, n, samples, conc, latency)
		if err != nil {
			return outcome{}, fmt.Errorf("%d workers: %w", n, err)
		}
		runs = append(runs, r)
	}
	return ceilingOutcome(runs, conc, latency), nil
}

// ceilingOnce ingests samples into a new schema and runs n worker
// processes over them.
func ceilingOnce(ctx context.Context, dsn string, n, samples, conc int, latency time.Duration) (ceilingRun, error) {
	schema := pgSchema("ceiling")
	st, err := pgOpen(ctx, postgres.Options{Schema: schema})
	if err != nil {
		return ceilingRun{}, err
	}
	err = ingestN(ctx, st, samples)
	st.Close()
	if err != nil {
		return ceilingRun{}, err
	}
	if err := pgServer.Exec(ctx, "regen_bench", "SELECT pg_stat_statements_reset()"); err != nil {
		return ceilingRun{}, err
	}
	self, err := os.Executable()
	if err != nil {
		return ceilingRun{}, err
	}
	mon := startPGMonitor(dsn)
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	t0 := time.Now()
	for i := range n {
		arg, _ := json.Marshal(ceilingArgs{DSN: dsn, Schema: schema, Owner: fmt.Sprintf("w%02d", i), Conc: conc, Latency: latency})
		cmds[i] = exec.CommandContext(ctx, self, "-ceiling-worker", string(arg))
		outs[i] = &bytes.Buffer{}
		cmds[i].Stdout, cmds[i].Stderr = outs[i], os.Stderr
		if err := cmds[i].Start(); err != nil {
			return ceilingRun{}, err
		}
	}
	r := ceilingRun{workers: n, samples: samples}
	var first, last time.Time
	var done int64
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			return ceilingRun{}, fmt.Errorf("worker %d: %w", i, err)
		}
		if ru, ok := c.ProcessState.SysUsage().(*syscall.Rusage); ok {
			r.cliCPU += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
		var rep ceilingReport
		if err := json.Unmarshal(outs[i].Bytes(), &rep); err != nil {
			return ceilingRun{}, fmt.Errorf("worker %d report: %w", i, err)
		}
		done += rep.Done
		r.claims, r.commits = append(r.claims, rep.Claims...), append(r.commits, rep.Commit...)
		if !rep.First.IsZero() && (first.IsZero() || rep.First.Before(first)) {
			first = rep.First
		}
		if rep.Last.After(last) {
			last = rep.Last
		}
	}
	r.wall = time.Since(t0)
	r.dbCPU, r.conns = mon.stop()
	if done != int64(samples) {
		return ceilingRun{}, fmt.Errorf("workers finished %d samples, want %d", done, samples)
	}
	r.rate = float64(samples) / last.Sub(first).Seconds()
	slices.Sort(r.claims)
	slices.Sort(r.commits)
	r.statements, err = statementCosts(ctx, dsn)
	if err != nil {
		return r, err
	}
	r.bytes, err = storeBytes(ctx, dsn, schema)
	return r, err
}

// storeBytes is the size on disk of the job's tables with their indexes.
func storeBytes(ctx context.Context, dsn, schema string) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	out := map[string]int64{}
	for _, t := range []string{"samples", "results"} {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, pgx.Identifier{schema, t}.Sanitize()).Scan(&n); err != nil {
			return nil, fmt.Errorf("size of %s: %w", t, err)
		}
		out[t] = n
	}
	return out, nil
}

// ingestN puts samples pending samples into st.
func ingestN(ctx context.Context, st store.Store, samples int) error {
	batch := make([]store.NewSample, 0, 1000)
	for i := range samples {
		batch = append(batch, store.NewSample{ID: fmt.Sprintf("s%08d", i), Partition: "p", Lane: "short",
			Body: fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Say hello %d"}]}`, i), PromptTokens: 9, Origin: fmt.Sprintf("p.jsonl:%d", i+1)})
		if len(batch) == cap(batch) || i == samples-1 {
			if _, err := st.Ingest(ctx, batch); err != nil {
				return fmt.Errorf("ingest: %w", err)
			}
			batch = batch[:0]
		}
	}
	return nil
}

// pgMonitor samples the server's processes every 100 ms: their CPU (a
// backend's last reading counts after it exits, so at most 100 ms of each
// is missed) and the peak number of client connections.
type pgMonitor struct {
	stopc chan struct{}
	done  chan struct{}
	cpu   time.Duration
	conns int
}

func startPGMonitor(dsn string) *pgMonitor {
	m := &pgMonitor{stopc: make(chan struct{}), done: make(chan struct{})}
	base := pgTicks()
	go func() {
		defer close(m.done)
		last := map[int]int64{}
		conn, err := pgx.Connect(context.Background(), dsn)
		if err == nil {
			defer conn.Close(context.Background())
		}
		for {
			for pid, t := range pgTicks() {
				last[pid] = t
			}
			if conn != nil {
				var n int
				if conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n) == nil {
					m.conns = max(m.conns, n)
				}
			}
			select {
			case <-m.stopc:
				var ticks int64
				for pid, t := range last {
					ticks += t - base[pid]
				}
				m.cpu = time.Duration(ticks) * time.Second / clockTicks
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return m
}

func (m *pgMonitor) stop() (time.Duration, int) {
	close(m.stopc)
	<-m.done
	return m.cpu, m.conns
}

// statementKinds names the store's statements by how their text starts.
var statementKinds = []struct{ prefix, kind string }{
	{"WITH ready AS", "claim"},
	{"WITH v AS", "commit: finish (samples, results, counts, stats)"},
	{"COMMIT", "commit: COMMIT (WAL flush)"},
	{"BEGIN", "commit: BEGIN"},
	{"SET LOCAL", "commit: SET LOCAL"},
	{"UPDATE samples SET lease_until", "extend leases"},
	{"WITH u AS (UPDATE samples SET state = 0, lease_owner = NULL, lease_until = NULL\n\t\tWHERE state = 1 AND lease_until", "expire leases"},
	{"INSERT INTO heartbeats", "heartbeat"},
}

// statementCosts reads pg_stat_statements for the bench database, grouped
// by the store operation each statement belongs to.
func statementCosts(ctx context.Context, dsn string) ([]stmtCost, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT query, calls, total_exec_time FROM pg_stat_statements s
		JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database()`)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_statements: %w", err)
	}
	by := map[string]*stmtCost{}
	for rows.Next() {
		var q string
		var calls int64
		var ms float64
		if err := rows.Scan(&q, &calls, &ms); err != nil {
			return nil, err
		}
		kind := "other: " + strings.Join(strings.Fields(q), " ")
		kind = kind[:min(len(kind), 48)]
		for _, k := range statementKinds {
			if strings.HasPrefix(strings.TrimSpace(q), k.prefix) {
				kind = k.kind
				break
			}
		}
		c := by[kind]
		if c == nil {
			c = &stmtCost{kind: kind}
			by[kind] = c
		}
		c.calls += calls
		c.total += time.Duration(ms * float64(time.Millisecond))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []stmtCost
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b stmtCost) int { return int(b.total - a.total) })
	return out, nil
}

// ceilingOutcome turns the runs into rows: each worker count against
// linear scaling from one worker, and the latencies against one worker's.
func ceilingOutcome(runs []ceilingRun, conc int, latency time.Duration) outcome {
	var out outcome
	one := runs[0]
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	pct := func(ds []time.Duration, q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		return ds[int(q*float64(len(ds)-1))]
	}
	for _, r := range runs {
		w := fmt.Sprintf("%d workers", r.workers)
		out.rows = append(out.rows,
			row{name: w + ", samples/s", unit: "samples/s", better: "higher", regen: r.rate, ref: float64(r.workers) * one.rate, note: "linear from 1 worker"},
			row{name: w + ", claim p50", unit: "ms", better: "lower", regen: ms(pct(r.claims, 0.5)), ref: ms(pct(one.claims, 0.5)), note: "1 worker"},
			row{name: w + ", claim p99", unit: "ms", better: "lower", regen: ms(pct(r.claims, 0.99)), ref: ms(pct(one.claims, 0.99)), note: "1 worker"},
			row{name: w + ", commit p50", unit: "ms", better: "lower", regen: ms(pct(r.commits, 0.5)), ref: ms(pct(one.commits, 0.5)), note: "1 worker"},
			row{name: w + ", commit p99", unit: "ms", better: "lower", regen: ms(pct(r.commits, 0.99)), ref: ms(pct(one.commits, 0.99)), note: "1 worker"},
		)
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.samples) }
		line := fmt.Sprintf("%d workers: %d samples in %.1f s, %.0f samples/s; database CPU %.0f µs/sample (%.2f cores), workers' CPU %.0f µs/sample (%.2f cores); peak %d connections; database time per sample:",
			r.workers, r.samples, r.wall.Seconds(), r.rate, per(r.dbCPU), r.dbCPU.Seconds()/r.wall.Seconds(), per(r.cliCPU), r.cliCPU.Seconds()/r.wall.Seconds(), r.conns)
		for _, s := range r.statements {
			if per(s.total) < 1 {
				continue
			}
			line += fmt.Sprintf(" %s %.0f µs (%d calls);", s.kind, per(s.total), s.calls)
		}
		out.detail = append(out.detail, line+fmt.Sprintf(" on disk per sample: samples %d B, results %d B (3-token answers, 50-byte prompts)",
			r.bytes["samples"]/int64(r.samples), r.bytes["results"]/int64(r.samples)))
	}
	out.detail = append(out.detail, fmt.Sprintf("each worker a process with its own pool (8 connections at most) and its own canned endpoint (concurrency %d, latency %s: at most %.0f samples/s a worker); PostgreSQL with fsync on; every process on the same 2 shared cores",
		conc, latency, float64(conc)/latency.Seconds()))
	return out
}
