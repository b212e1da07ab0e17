package web

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// bigStore writes n finished samples (1% dead, 1% rejected, the rest done)
// in two partitions, 48 hours of history and a thousand events. Rows go in
// through SQL in large transactions: the state machine's per-sample commits
// would take minutes for a fixture.
func bigStore(b *testing.B, n int) (*sqlite.Store, string) {
	b.Helper()
	path := filepath.Join(b.TempDir(), "big.db")
	st, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	db := st.DB()
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("a prompt of some length ", 40) + `"}]}`
	resp := `{"content":"` + strings.Repeat("an answer of some length ", 80) + `","usage":{"completion_tokens":500}}`
	now := time.Now().UnixNano()
	const batch = 20000
	if _, err := db.Exec(`INSERT INTO origins (id, prefix) VALUES (1, 'A.jsonl:'), (2, 'B.jsonl:')`); err != nil {
		b.Fatal(err)
	}
	for start := 0; start < n; start += batch {
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		insS, err := tx.Prepare(`INSERT INTO samples (id, partition, lane, prompt_tokens, origin_file, origin_pos, state, attempts, last_error, finished_at)
			VALUES (?, ?, 'short', 300, ?, ?, ?, 1, ?, ?)`)
		if err != nil {
			b.Fatal(err)
		}
		insR, err := tx.Prepare(`INSERT INTO results (sample_id, response, finish_reason, prompt_tokens, completion_tokens, endpoint, duration_ns, ttft_ns, reason, finished_at)
			VALUES (?, ?, 'stop', 300, 500, 'http://127.0.0.1:30000', 9000000000, 200000000, ?, ?)`)
		if err != nil {
			b.Fatal(err)
		}
		for i := start; i < min(n, start+batch); i++ {
			part := "A"
			if i%2 == 1 {
				part = "B"
			}
			id := fmt.Sprintf("%s/%07d", part, i)
			state, lastErr, reason := "done", sql.NullString{}, ""
			switch i % 100 {
			case 7:
				state, lastErr = "dead", sql.NullString{String: "400: context too long", Valid: true}
			case 8:
				state, reason = "rejected", "empty answer"
			}
			fin := now - int64(n-i)*int64(time.Millisecond)
			if _, err := insS.Exec(id, part, 1+i%2, strconv.Itoa(i+1), state, lastErr, fin); err != nil {
				b.Fatal(err)
			}
			if state != "dead" {
				if _, err := insR.Exec(id, resp, reason, fin); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	// Bodies and counts as Ingest keeps them (no per-row trigger for these).
	if _, err := db.Exec(`INSERT INTO sample_bodies (seq, body) SELECT seq, CAST(? AS BLOB) FROM samples`, body); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO counts (partition, lane, state, n)
		SELECT partition, lane, state, count(*) FROM samples GROUP BY 1, 2, 3`); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	minute := time.Now().Truncate(time.Minute)
	var ms []store.Minute
	for i := range 48 * 60 {
		t := minute.Add(-time.Duration(i) * time.Minute)
		ms = append(ms, store.Minute{Time: t, Worker: "w", Tokens: 60000, Requests: 120, Samples: 120, KVUsage: -1, Queued: -1, Running: -1},
			store.Minute{Time: t, Worker: "w", Endpoint: "http://127.0.0.1:30000", Tokens: 60000, Requests: 120, KVUsage: 0.8, Queued: 3, Running: 60})
	}
	if err := st.PutMinutes(ctx, ms); err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		if err := st.AddEvent(ctx, store.Event{Kind: "endpoint_state", Subject: "http://127.0.0.1:30000", State: "READY", Evidence: strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	return st, path
}

func rssKB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// BenchmarkDashboardMemory measures what the dashboard and the watch view
// add to a process holding a store of REGEN_BENCH_SAMPLES (default 10^6)
// samples: a second store handle (as regen run --web opens), the server,
// and per round every read the pages and the terminal view make. It
// reports the Go heap retained after the rounds, the heap's peak during
// them, and the process's resident-set growth (which also counts SQLite's
// page cache, outside the Go heap).
//
//	go test ./internal/web -run '^$' -bench DashboardMemory -benchtime 20x
func BenchmarkDashboardMemory(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("REGEN_BENCH_SAMPLES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	runner, path := bigStore(b, n)
	defer runner.Close()
	ctx := context.Background()
	report := func(st store.Store) func(context.Context) (monitor.Report, error) {
		return func(ctx context.Context) (monitor.Report, error) {
			return monitor.Assess(ctx, st, monitor.AssessOptions{Job: "big", Now: time.Now(), DeadAfter: time.Minute})
		}
	}
	if _, err := report(runner)(ctx); err != nil { // warm the runner's own handle
		b.Fatal(err)
	}
	heap0, rss0 := heapInUse(), rssKB()

	dash, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer dash.Close()
	srv, err := New(Options{Store: dash, Report: report(dash)})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	paths := []string{"/", "/assets/uPlot.iife.min.js", "/api/status", "/api/history?window=48h", "/api/events?limit=2000",
		"/api/samples?state=dead&limit=500", "/api/samples?state=rejected&partition=B&limit=500", "/api/samples?partition=A&limit=500",
		"/api/samples?state=done&after=A/0500000&limit=500", "/api/samples/B/0000999", "/api/ingest-errors", "/metrics"}

	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	b.ResetTimer()
	for b.Loop() {
		for _, p := range paths {
			resp, err := http.Get(ts.URL + p)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d", p, resp.StatusCode)
			}
		}
		// What one refresh of regen watch reads.
		if _, err := report(dash)(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := monitor.ReadHistory(ctx, dash, monitor.JobAxis(monitor.RunSpan{}, false, time.Now(), 0), time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	close(stop)
	<-done
	retained := int64(heapInUse()) - int64(heap0)
	b.ReportMetric(float64(retained)/(1<<20), "retained-heap-MB")
	b.ReportMetric(float64(int64(peak.Load())-int64(heap0))/(1<<20), "peak-heap-MB")
	b.ReportMetric(float64(rssKB()-rss0)/1024, "rss-growth-MB")
	b.ReportMetric(float64(n), "samples")
}
