package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/regen-dev/regen/internal/store"
)

// The dashboard's history and the sample browser.

func testMinutes(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	row := func(min int, worker, endpoint string, tokens int64) store.Minute {
		return store.Minute{Time: base.Add(time.Duration(min) * time.Minute), Worker: worker, Endpoint: endpoint,
			Samples: min + 1, Tokens: tokens, Requests: int64(min + 2), Errors: int64(min), InFlight: 7,
			KVUsage: 0.25, Queued: 3, Running: 12, Limit: 64}
	}
	got, err := s.Minutes(ctx, time.Time{})
	if err != nil || len(got) != 0 {
		t.Fatalf("Minutes on an empty store = %v, %v; want none", got, err)
	}
	must(t, s.PutMinutes(ctx, []store.Minute{row(1, "w2", "", 10), row(0, "w1", "http://b", 20), row(0, "w1", "", 30)}))
	must(t, s.PutMinutes(ctx, nil))
	// The runner rewrites the current minute as it goes: the last write wins.
	updated := row(1, "w2", "", 99)
	updated.KVUsage, updated.Queued, updated.Running = -1, -1, -1
	must(t, s.PutMinutes(ctx, []store.Minute{updated, row(2, "w1", "", 40)}))

	eq := cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })
	want := []store.Minute{row(0, "w1", "", 30), row(0, "w1", "http://b", 20), updated, row(2, "w1", "", 40)}
	got, err = s.Minutes(ctx, time.Time{})
	must(t, err)
	if diff := cmp.Diff(want, got, eq); diff != "" {
		t.Errorf("Minutes(all) (-want +got):\n%s", diff)
	}
	got, err = s.Minutes(ctx, base.Add(time.Minute))
	must(t, err)
	if diff := cmp.Diff(want[2:], got, eq); diff != "" {
		t.Errorf("Minutes(since minute 1) (-want +got):\n%s", diff)
	}
}

// browseFixture has one sample in every state, in two partitions.
func browseFixture(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("A", "short", "a1", "a2", "a3", "a4", "a5", "a6"))
	ingest(t, s, samples("B", "long", "b1", "b2"))
	all := claim(t, s, "short", 6, "w")
	if len(all) != 6 {
		t.Fatalf("claimed %d, want 6", len(all))
	}
	must(t, s.Complete(ctx, "a1", "w", result("a1")))
	must(t, s.Reject(ctx, "a2", "w", result("a2"), "empty", "empty answer"))
	must(t, s.DeadLetter(ctx, "a3", "w", "400: context too long"))
	must(t, s.Retry(ctx, "a4", "w", time.Now().Add(time.Hour), "503: busy"))
	must(t, s.Release(ctx, []string{"a5"}, "w"))
	// a6 stays leased; b1 and b2 stay pending; b2 is dead-lettered below.
	claim(t, s, "long", 2, "w")
	must(t, s.DeadLetter(ctx, "b2", "w", "400: bad tool schema"))
	must(t, s.Release(ctx, []string{"b1"}, "w"))
}

func testSampleLookup(t *testing.T, s store.Store) {
	ctx := context.Background()
	browseFixture(t, s)
	if _, ok, err := s.Sample(ctx, "nope"); err != nil || ok {
		t.Fatalf("Sample(unknown) = ok %v, err %v; want not found", ok, err)
	}
	for _, tc := range []struct {
		id       string
		state    store.State
		attempts int
		reason   string
		rule     string
		result   bool
	}{
		{"a1", store.Done, 1, "", "", true},
		{"a2", store.Rejected, 1, "empty answer", "empty", true},
		{"a3", store.Dead, 1, "400: context too long", "", false},
		{"a4", store.Pending, 1, "503: busy", "", false},
		{"a5", store.Pending, 0, "", "", false},
		{"a6", store.Leased, 0, "", "", false},
	} {
		r, ok, err := s.Sample(ctx, tc.id)
		if err != nil || !ok {
			t.Fatalf("Sample(%s) = ok %v, err %v", tc.id, ok, err)
		}
		want := sample("A", "short", tc.id)
		if r.ID != tc.id || r.Partition != "A" || r.Lane != "short" || string(r.Body) != string(want.Body) || r.Origin != want.Origin {
			t.Errorf("Sample(%s) = %+v, want id, partition A, lane short, body %s, origin %s", tc.id, r, want.Body, want.Origin)
		}
		if r.State != tc.state || r.Attempts != tc.attempts || r.Reason != tc.reason || r.Rule != tc.rule || r.Prior != nil {
			t.Errorf("Sample(%s): state %s, attempts %d, reason %q, rule %q, %d earlier turns; want %s, %d, %q, %q, none",
				tc.id, r.State, r.Attempts, r.Reason, r.Rule, len(r.Prior), tc.state, tc.attempts, tc.reason, tc.rule)
		}
		if tc.result {
			if diff := cmp.Diff(result(tc.id), r.Result); diff != "" {
				t.Errorf("Sample(%s) result (-want +got):\n%s", tc.id, diff)
			}
			if r.FinishedAt.IsZero() {
				t.Errorf("Sample(%s) has no finish time", tc.id)
			}
		} else if r.Result.FinishReason != "" || r.Result.Response != nil {
			t.Errorf("Sample(%s) has a result %+v, want none", tc.id, r.Result)
		}
	}
}

func testSamplesListing(t *testing.T, s store.Store) {
	ctx := context.Background()
	browseFixture(t, s)
	list := func(q store.SampleQuery) []string {
		t.Helper()
		rows, err := s.Samples(ctx, q)
		if err != nil {
			t.Fatalf("Samples(%+v): %v", q, err)
		}
		var out []string
		for _, r := range rows {
			if r.Body != nil || r.Result.Response != nil {
				t.Errorf("Samples(%+v) row %s carries its body or response", q, r.ID)
			}
			out = append(out, fmt.Sprintf("%s %s", r.ID, r.State))
		}
		return out
	}
	for _, tc := range []struct {
		q    store.SampleQuery
		want []string
	}{
		{store.SampleQuery{}, []string{"a1 done", "a2 rejected", "a3 dead", "a4 pending", "a5 pending", "a6 leased", "b1 pending", "b2 dead"}},
		{store.SampleQuery{Partition: "B"}, []string{"b1 pending", "b2 dead"}},
		{store.SampleQuery{State: store.Dead}, []string{"a3 dead", "b2 dead"}},
		{store.SampleQuery{State: store.Dead, Partition: "A"}, []string{"a3 dead"}},
		{store.SampleQuery{State: store.Rejected}, []string{"a2 rejected"}},
		{store.SampleQuery{State: store.Done}, []string{"a1 done"}},
		{store.SampleQuery{State: store.Leased}, []string{"a6 leased"}},
		{store.SampleQuery{State: store.Pending, Partition: "A"}, []string{"a4 pending", "a5 pending"}},
		{store.SampleQuery{Limit: 3}, []string{"a1 done", "a2 rejected", "a3 dead"}},
		{store.SampleQuery{After: "a3", Limit: 3}, []string{"a4 pending", "a5 pending", "a6 leased"}},
		{store.SampleQuery{After: "a6", Partition: "A"}, nil},
		{store.SampleQuery{Partition: "nope"}, nil},
	} {
		if diff := cmp.Diff(tc.want, list(tc.q), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Samples(%+v) (-want +got):\n%s", tc.q, diff)
		}
	}
	// Rows carry what a listing shows: reasons, results' numbers, origin.
	rows, err := s.Samples(ctx, store.SampleQuery{Partition: "A", Limit: 4})
	must(t, err)
	wantRows := []store.Row{
		{ID: "a1", Partition: "A", Lane: "short", State: store.Done, Attempts: 1, Origin: "A.jsonl:a1", Result: withoutResponse(result("a1"))},
		{ID: "a2", Partition: "A", Lane: "short", State: store.Rejected, Attempts: 1, Origin: "A.jsonl:a2", Result: withoutResponse(result("a2")), Reason: "empty answer", Rule: "empty"},
		{ID: "a3", Partition: "A", Lane: "short", State: store.Dead, Attempts: 1, Origin: "A.jsonl:a3", Reason: "400: context too long"},
		{ID: "a4", Partition: "A", Lane: "short", State: store.Pending, Attempts: 1, Origin: "A.jsonl:a4", Reason: "503: busy"},
	}
	if diff := cmp.Diff(wantRows, rows, cmpopts.IgnoreFields(store.Row{}, "FinishedAt")); diff != "" {
		t.Errorf("Samples(partition A) rows (-want +got):\n%s", diff)
	}
	// A default page is bounded.
	many := make([]store.NewSample, 0, 150)
	for i := range 150 {
		many = append(many, sample("C", "short", fmt.Sprintf("c%03d", i)))
	}
	ingest(t, s, many)
	rows, err = s.Samples(ctx, store.SampleQuery{Partition: "C"})
	must(t, err)
	if len(rows) != 100 || rows[0].ID != "c000" || rows[99].ID != "c099" {
		t.Errorf("Samples(partition C, no limit) = %d rows, want the first 100", len(rows))
	}
}

// testSampleTurns: a multi-turn sample shows the answers to its earlier
// turns while it is in progress and once it is finished; a listing
// carries the last answer's turn but no earlier answers.
func testSampleTurns(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("M", "short", "m1"))
	claimOne(t, s, "short", "w", "m1")
	r0 := turnResult("m1", 0, "stop", 10, 20, 5)
	must(t, s.CompleteTurn(ctx, "m1", "w", r0, "long"))
	stored0 := r0
	stored0.Lane, stored0.Attempts = "short", 1

	r, ok, err := s.Sample(ctx, "m1")
	if err != nil || !ok {
		t.Fatalf("Sample(m1) in progress = ok %v, err %v", ok, err)
	}
	if r.State != store.Pending || r.Lane != "long" || r.Result.FinishReason != "" {
		t.Errorf("Sample(m1) in progress: state %s, lane %s, result %+v; want pending in long, no last answer", r.State, r.Lane, r.Result)
	}
	if diff := cmp.Diff([]store.Result{stored0}, r.Prior); diff != "" {
		t.Errorf("Sample(m1) in progress, earlier turns (-want +got):\n%s", diff)
	}

	claimOne(t, s, "long", "w", "m1")
	r1 := turnResult("m1", 1, "stop", 40, 3, 0)
	must(t, s.Reject(ctx, "m1", "w", r1, "empty", "3 tokens of whitespace"))
	r, _, err = s.Sample(ctx, "m1")
	must(t, err)
	if diff := cmp.Diff(r1, r.Result); diff != "" {
		t.Errorf("Sample(m1) rejected at turn 1, last answer (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]store.Result{stored0}, r.Prior); diff != "" {
		t.Errorf("Sample(m1) rejected at turn 1, earlier turns (-want +got):\n%s", diff)
	}
	if r.State != store.Rejected || r.Rule != "empty" || r.Reason != "3 tokens of whitespace" {
		t.Errorf("Sample(m1): state %s, rule %q, reason %q; want rejected by empty with its evidence", r.State, r.Rule, r.Reason)
	}
	rows, err := s.Samples(ctx, store.SampleQuery{Partition: "M"})
	must(t, err)
	if len(rows) != 1 || rows[0].Result.Turn != 1 || rows[0].Rule != "empty" || rows[0].Prior != nil {
		t.Errorf("Samples(partition M) = %+v, want m1 at turn 1, rule empty, no earlier answers", rows)
	}
}

func withoutResponse(r store.Result) store.Result {
	r.Response = nil
	return r
}
