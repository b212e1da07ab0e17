package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store"
)

// TestSamplesQueryPlans pins how the listings read a big job: a page of
// dead letters or rejects among 10^5 done samples reads their partial
// indexes, the leased ones theirs, and no listing reads the whole table.
func TestSamplesQueryPlans(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Options{})
	defer s.Close()
	// Rows written directly: the plans depend on the table's shape, not on
	// how it got there.
	for _, q := range []string{
		`INSERT INTO origins (prefix) VALUES ('f.jsonl:')`,
		`INSERT INTO samples (id, partition, lane, state, prompt_tokens, origin_file, origin_pos, body, finished_at, lease_owner, lease_until)
		SELECT 'id' || lpad(i::text, 7, '0'), 'p' || (i % 4), 'short',
			CASE WHEN i % 10000 = 1 THEN 4 WHEN i % 10000 = 2 THEN 3 WHEN i % 10000 = 3 THEN 1 WHEN i % 10000 = 4 THEN 0 ELSE 2 END,
			1, 1, i::text, '\x7b7d'::bytea,
			CASE WHEN i % 10000 IN (3, 4) THEN NULL ELSE i END,
			CASE WHEN i % 10000 = 3 THEN 'w' END, CASE WHEN i % 10000 = 3 THEN 1 END
		FROM generate_series(1, 100000) i`,
		`ANALYZE samples`,
	} {
		if _, err := s.Pool().Exec(ctx, q); err != nil {
			t.Fatalf("build a big job: %v", err)
		}
	}
	for _, tc := range []struct {
		name string
		q    store.SampleQuery
		want string
	}{
		{"dead", store.SampleQuery{State: store.Dead}, "samples_dead_id"},
		{"rejected in a partition", store.SampleQuery{State: store.Rejected, Partition: "p2"}, "samples_rejected_id"},
		{"leased", store.SampleQuery{State: store.Leased}, "samples_leased"},
		{"done", store.SampleQuery{State: store.Done, After: "id0050000"}, "samples_"},
		{"partition", store.SampleQuery{Partition: "p1"}, "samples_id_key"},
		{"all", store.SampleQuery{After: "id0075000"}, "samples_id_key"},
	} {
		query, args, err := samplesQuery(tc.q)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := s.Pool().Query(ctx, "EXPLAIN "+query, args...)
		if err != nil {
			t.Fatalf("%s: explain: %v", tc.name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: explain: %v", tc.name, err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, tc.want) || strings.Contains(plan, "Seq Scan on samples") {
			t.Errorf("%s: plan does not read %s, or reads the whole table:\n%s", tc.name, tc.want, plan)
		}
		got, err := s.Samples(ctx, tc.q)
		if err != nil || len(got) == 0 {
			t.Errorf("%s: Samples = %d rows, %v; want some", tc.name, len(got), err)
		}
	}
}
