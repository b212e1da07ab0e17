package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// benchBatch is one ingest batch of the runner's size, tiny prompts.
func benchBatch(round, n int) []store.NewSample {
	out := make([]store.NewSample, n)
	for i := range out {
		id := fmt.Sprintf("r%03d-%06d", round, i)
		out[i] = store.NewSample{ID: "p/" + id, Partition: "p", Lane: "short",
			Body:   fmt.Appendf(nil, `{"messages":[{"role":"user","content":"Say hi %d"}]}`, i),
			Origin: fmt.Sprintf("/data/tiny.jsonl:%d", round*n+i+1), PromptTokens: 9}
	}
	return out
}

// BenchmarkIngest compares the store's Ingest (one INSERT ... SELECT FROM
// unnest of arrays, counts and duplicate checks in the same statement)
// with COPY into a temporary staging table followed by the same INSERT
// from it. One op is a batch of 1,000. On the development machine the two
// are within noise of each other (40-48k rows/s), and COPY would need a
// staging table per connection and a second statement for duplicates, so
// Ingest stays one statement.
func BenchmarkIngest(b *testing.B) {
	ctx := context.Background()
	const n = 1000
	b.Run("unnest", func(b *testing.B) {
		s := openTest(b, Options{})
		defer s.Close()
		round := 0
		for b.Loop() {
			if _, err := s.Ingest(ctx, benchBatch(round, n)); err != nil {
				b.Fatal(err)
			}
			round++
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("copy-staging", func(b *testing.B) {
		s := openTest(b, Options{})
		defer s.Close()
		conn, err := s.Pool().Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `CREATE TEMP TABLE stage (id text, partition text, lane text, body bytea,
			prompt_tokens int4, origin_file int4, origin_pos text) ON COMMIT DELETE ROWS`); err != nil {
			b.Fatal(err)
		}
		round := 0
		for b.Loop() {
			batch := benchBatch(round, n)
			files, err := s.originFiles(ctx, batch)
			if err != nil {
				b.Fatal(err)
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"stage"}, []string{"id", "partition", "lane", "body", "prompt_tokens", "origin_file", "origin_pos"},
				pgx.CopyFromSlice(len(batch), func(i int) ([]any, error) {
					_, pos := store.SplitOrigin(batch[i].Origin)
					return []any{batch[i].ID, batch[i].Partition, batch[i].Lane, batch[i].Body, int32(batch[i].PromptTokens), files[i], pos}, nil
				})); err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `WITH ins AS (
					INSERT INTO samples (id, partition, lane, body, prompt_tokens, origin_file, origin_pos, state)
					SELECT id, partition, lane, body, prompt_tokens, origin_file, origin_pos, 0 FROM stage
					ON CONFLICT (id) DO NOTHING RETURNING partition, lane
				), counted AS (
					INSERT INTO counts AS c (partition, lane, state, shard, n)
					SELECT partition, lane, 0, pg_backend_pid() % 256, count(*) FROM ins GROUP BY partition, lane
					ON CONFLICT (partition, lane, state, shard) DO UPDATE SET n = c.n + excluded.n
				) SELECT 1 FROM ins`); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			round++
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
	})
}
