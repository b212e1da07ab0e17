package stats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store/sqlite"
)

// benchStore builds (once per size, in the benchmark's temp dir) a store
// of n finished samples in 6 partition/lane cells, written with plain SQL
// inserts so that the store's own triggers keep the statistics as they do
// for a real job (bodies and counts filled after, as Ingest keeps them),
// and returns its path.
func benchStore(b *testing.B, n int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), fmt.Sprintf("stats-%d.db", n))
	st, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	db := st.DB()
	rng := rand.New(rand.NewPCG(1, 1))
	start := time.Now()
	t0 := time.Now().Add(-72 * time.Hour).UnixNano()
	const batch = 50_000
	if _, err := db.Exec(`INSERT INTO origins (id, prefix) VALUES (1, 'f.jsonl:')`); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i += batch {
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		ins, err := tx.Prepare(`INSERT INTO samples (id, partition, lane, prompt_tokens, origin_file, origin_pos, state, attempts, finished_at)
			VALUES (?, ?, ?, ?, 1, ?, ?, 1, ?)`)
		if err != nil {
			b.Fatal(err)
		}
		res, err := tx.Prepare(`INSERT INTO results (sample_id, response, finish_reason, prompt_tokens, completion_tokens, endpoint,
				duration_ns, ttft_ns, reason, finished_at, turn, partition, lane, reasoning_tokens, rule)
			VALUES (?, '{}', ?, ?, ?, 'http://e', 1, 1, ?, ?, 0, ?, ?, ?, ?)`)
		if err != nil {
			b.Fatal(err)
		}
		for j := i; j < min(i+batch, n); j++ {
			id := "s" + strconv.Itoa(j)
			p := []string{"B1_glaive", "B2_opencode", "B3_chat"}[j%3]
			lane := []string{"short", "long"}[rng.IntN(2)]
			pt, ct := 20+rng.IntN(8000), 1+rng.IntN(16384)
			finish, state, rule, reason := "stop", "done", "", ""
			if rng.IntN(30) == 0 {
				finish, state, rule, reason = "length", "rejected", "truncated", "cut"
			}
			at := t0 + int64(j)*int64(72*time.Hour)/int64(n)
			if _, err := ins.Exec(id, p, lane, pt, strconv.Itoa(j+1), state, at); err != nil {
				b.Fatal(err)
			}
			if _, err := res.Exec(id, finish, pt, ct, reason, at, p, lane, rng.IntN(2)*ct/3, rule); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	// Bodies and counts as Ingest keeps them (no per-row trigger for these).
	for _, q := range []string{
		`INSERT INTO sample_bodies (seq, body) SELECT seq, CAST('{"messages":[]}' AS BLOB) FROM samples`,
		`INSERT INTO counts (partition, lane, state, n) SELECT partition, lane, state, count(*) FROM samples GROUP BY 1, 2, 3`,
	} {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("built a %d-sample store in %s", n, time.Since(start).Round(time.Second))
	return path
}

// BenchmarkCompute reads the statistics of a 10^6-sample store (set
// REGEN_STATS_BENCH_N to change the size; building the store takes a few
// minutes and is not timed). B/op staying flat between sizes is the
// flat-memory check.
func BenchmarkCompute(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("REGEN_STATS_BENCH_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		n = v
	}
	path := benchStore(b, n)
	st, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	var rep Report
	for b.Loop() {
		if rep, err = Compute(ctx, st, "bench", time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if rep.Total.Samples.Total != n || rep.Total.Answers != n {
		b.Fatalf("report counts %d samples, %d answers; want %d", rep.Total.Samples.Total, rep.Total.Answers, n)
	}
	b.ReportMetric(float64(len(rep.Cells)), "cells")
}
