package sqlite

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

var benchResponse = []byte(`{"content":"` + strings.Repeat("x", 1000) + `"}`) // ~1 KB

func benchSamples(prefix string, n int) []store.NewSample {
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("q", 200) + `"}]}`)
	out := make([]store.NewSample, n)
	for i := range out {
		out[i] = store.NewSample{ID: fmt.Sprintf("%s%09d", prefix, i), Partition: "p", Lane: "short", Body: body, PromptTokens: 60, Origin: "p.jsonl:1"}
	}
	return out
}

func benchStore(b *testing.B) *Store {
	b.Helper()
	s, err := Open(b.TempDir() + "/bench.db")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func ingestAll(b *testing.B, s *Store, in []store.NewSample) {
	b.Helper()
	for i := 0; i < len(in); i += 1000 {
		if _, err := s.Ingest(context.Background(), in[i:min(i+1000, len(in))]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkComplete measures one Complete (1 KB response, one transaction
// each) on already-claimed samples.
func BenchmarkComplete(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	ingestAll(b, s, benchSamples("s", b.N))
	var claimed []store.Claimed
	for len(claimed) < b.N {
		cs, err := s.Claim(ctx, "short", 1000, "w", time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		claimed = append(claimed, cs...)
	}
	r := store.Result{Response: benchResponse, FinishReason: "stop", PromptTokens: 60, CompletionTokens: 250, Endpoint: "http://127.0.0.1:30000", Duration: time.Second}
	b.ResetTimer()
	for i := range b.N {
		if err := s.Complete(ctx, claimed[i].ID, "w", r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}

// BenchmarkIngest measures ingest in batches of 1000 new samples; one op is
// one batch.
func BenchmarkIngest(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	in := benchSamples("s", b.N*1000)
	b.ResetTimer()
	for i := range b.N {
		n, err := s.Ingest(ctx, in[i*1000:(i+1)*1000])
		if err != nil || n != 1000 {
			b.Fatalf("Ingest = %d, %v", n, err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkClaimComplete is the dispatcher's loop: claim a batch of 32,
// complete each sample in its own transaction. One op is one sample.
func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	ingestAll(b, s, benchSamples("s", b.N+32))
	r := store.Result{Response: benchResponse, FinishReason: "stop", PromptTokens: 60, CompletionTokens: 250}
	b.ResetTimer()
	for done := 0; done < b.N; {
		cs, err := s.Claim(ctx, "short", min(32, b.N-done), "w", time.Hour)
		if err != nil || len(cs) == 0 {
			b.Fatalf("Claim = %d, %v", len(cs), err)
		}
		for _, c := range cs {
			if err := s.Complete(ctx, c.ID, "w", r); err != nil {
				b.Fatal(err)
			}
		}
		done += len(cs)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkClaimAtMillion claims 32 samples at a time from a store of 10^6
// pending samples (two lanes) whose oldest 100,000 wait for a retry time,
// and reads Counts: the partial indexes and the counts table keep both flat.
func BenchmarkClaimAtMillion(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	// Bulk-fill the current tables directly (Ingest would take minutes):
	// samples, their bodies, and the counts Ingest keeps per batch.
	for _, q := range []string{
		`INSERT INTO origins (id, prefix) VALUES (1, 'x.jsonl:')`,
		`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 999999)
		INSERT INTO samples (id, partition, lane, prompt_tokens, origin_file, origin_pos, state, not_before)
		SELECT printf('s%09d', i), 'p', CASE WHEN i % 2 = 0 THEN 'short' ELSE 'long' END, 60, 1, i + 1,
			'pending', CASE WHEN i < 100000 THEN 9000000000000000000 ELSE 0 END FROM n`,
		`INSERT INTO sample_bodies (seq, body) SELECT seq, zeroblob(300) FROM samples`,
		`INSERT INTO counts (partition, lane, state, n) SELECT partition, lane, state, count(*) FROM samples GROUP BY 1, 2, 3`,
	} {
		if _, err := s.DB().Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("Claim32", func(b *testing.B) {
		claimed := 0
		for range b.N {
			if claimed+32 > 400000 { // keep to the 400,000 due short samples
				b.StopTimer()
				if _, err := s.ReleaseOwner(ctx, "w"); err != nil {
					b.Fatal(err)
				}
				claimed = 0
				b.StartTimer()
			}
			cs, err := s.Claim(ctx, "short", 32, "w", time.Hour)
			if err != nil || len(cs) != 32 {
				b.Fatalf("Claim = %d, %v", len(cs), err)
			}
			claimed += 32
		}
	})
	b.Run("Counts", func(b *testing.B) {
		for range b.N {
			if _, err := s.Counts(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkIngestErrorsAtMillion reads a store whose source had 10^6 bad
// rows (a wrong field mapping): status counts them, export streams them.
// live-MB is the most heap found live during the walk, which stays at a
// page's worth whatever the row count.
func BenchmarkIngestErrorsAtMillion(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	_, err := s.DB().Exec(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 999999)
		INSERT INTO ingest_errors (origin, partition, field, reason, created_at)
		SELECT printf('data/part-%03d.jsonl:%d', i % 100, i), 'p', 'input', 'field input: missing', 0 FROM n`)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Count", func(b *testing.B) {
		for range b.N {
			if n, err := s.IngestErrorCount(ctx); err != nil || n != 1000000 {
				b.Fatalf("IngestErrorCount = %d, %v", n, err)
			}
		}
	})
	b.Run("Each", func(b *testing.B) {
		var live uint64
		for range b.N {
			n := 0
			err := s.EachIngestError(ctx, func(store.IngestError) error {
				if n++; n%250000 == 0 {
					runtime.GC()
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					live = max(live, ms.HeapAlloc)
				}
				return nil
			})
			if err != nil || n != 1000000 {
				b.Fatalf("EachIngestError visited %d, %v", n, err)
			}
		}
		b.ReportMetric(float64(live)/(1<<20), "live-MB")
	})
}
