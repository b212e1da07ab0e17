package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// trainingTests are the cases for multi-turn regeneration, quality rejects,
// dataset statistics and duplicate ids at ingest.
var trainingTests = []struct {
	name string
	fn   func(t *testing.T, s store.Store)
}{
	{"CompleteTurnOncePerTurnInOrder", testCompleteTurn},
	{"CompleteTurnKeepsRetryAttemptsPerTurn", testCompleteTurnAttempts},
	{"CompleteTurnNeedsTheLease", testCompleteTurnLease},
	{"RequeueRejectedByRule", testRequeueRejected},
	{"StatsFollowStoredAnswers", testStats},
	{"IngestDuplicates", testIngestDuplicates},
}

func turnResult(id string, turn int, finish string, pt, ct, rt int) store.Result {
	r := result(id)
	r.Response = []byte(`{"content":"turn ` + string(rune('0'+turn)) + ` of ` + id + `"}`)
	r.Turn, r.FinishReason, r.PromptTokens, r.CompletionTokens, r.ReasoningTokens = turn, finish, pt, ct, rt
	return r
}

func rc(partition, lane, rule string, n int) store.RejectCount {
	return store.RejectCount{Partition: partition, Lane: lane, Rule: rule, N: n}
}

func tcount(partition, lane, kind string, tokens, n int) store.TokenCount {
	return store.TokenCount{Partition: partition, Lane: lane, Kind: kind, Tokens: tokens, N: n}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: err = %v, want %v", what, err, want)
	}
}

func testCompleteTurn(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	c := claimOne(t, s, "short", "w", "a")
	if c.Turn != 0 || c.Prior != nil {
		t.Fatalf("first claim: turn %d, prior %v; want turn 0, none", c.Turn, c.Prior)
	}
	r0 := turnResult("a", 0, "stop", 10, 20, 5)
	wantErr(t, "CompleteTurn for turn 1 at turn 0", s.CompleteTurn(ctx, "a", "w", turnResult("a", 1, "stop", 1, 1, 0), ""), store.ErrWrongTurn)
	must(t, s.CompleteTurn(ctx, "a", "w", r0, "long"))
	wantStates(t, s, map[string]int{"p/long/pending": 1})
	wantErr(t, "second CompleteTurn of turn 0", s.CompleteTurn(ctx, "a", "w", r0, ""), store.ErrNotLeased)
	if rows := finished(t, s); len(rows) != 0 {
		t.Errorf("Finished after one turn = %d rows, want 0", len(rows))
	}

	c = claimOne(t, s, "long", "w2", "a")
	stored0 := r0
	stored0.Lane, stored0.Attempts = "short", 1
	if c.Turn != 1 || c.Attempts != 0 {
		t.Errorf("second claim: turn %d, %d attempts; want turn 1, 0 attempts", c.Turn, c.Attempts)
	}
	if diff := cmp.Diff([]store.Result{stored0}, c.Prior); diff != "" {
		t.Errorf("Prior of turn 1 (-want +got):\n%s", diff)
	}
	r1 := turnResult("a", 1, "stop", 40, 30, 0)
	must(t, s.CompleteTurn(ctx, "a", "w2", r1, ""))
	c = claimOne(t, s, "long", "w3", "a")
	stored1 := r1
	stored1.Lane, stored1.Attempts = "long", 1
	if diff := cmp.Diff([]store.Result{stored0, stored1}, c.Prior); diff != "" {
		t.Errorf("Prior of turn 2 (-want +got):\n%s", diff)
	}
	wantErr(t, "Complete naming turn 1 at turn 2", s.Complete(ctx, "a", "w3", r1), store.ErrWrongTurn)
	r2 := turnResult("a", 2, "stop", 90, 7, 0)
	r2.EndReason = "turn 2 called f where the dataset did not"
	must(t, s.Complete(ctx, "a", "w3", r2))
	rows := finished(t, s)
	want := []store.Row{{ID: "a", Partition: "p", Lane: "long", State: store.Done, Body: sample("p", "short", "a").Body,
		Attempts: 1, Result: r2, Prior: []store.Result{stored0, stored1}, Origin: sample("p", "short", "a").Origin}}
	if diff := cmp.Diff(want, rows, ignoreFinishedAt); diff != "" {
		t.Errorf("Finished (-want +got):\n%s", diff)
	}
}

func testCompleteTurnAttempts(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	claimOne(t, s, "short", "w", "a")
	must(t, s.Retry(ctx, "a", "w", time.Now().Add(-time.Second), "429"))
	c := claimOne(t, s, "short", "w", "a")
	if c.Attempts != 1 {
		t.Fatalf("attempts after a retry = %d, want 1", c.Attempts)
	}
	must(t, s.CompleteTurn(ctx, "a", "w", turnResult("a", 0, "stop", 1, 2, 0), ""))
	c = claimOne(t, s, "short", "w", "a")
	if c.Attempts != 0 || len(c.Prior) != 1 || c.Prior[0].Attempts != 2 {
		t.Errorf("turn 1 claim: %d attempts, prior %+v; want 0 attempts and turn 0 stored with 2", c.Attempts, c.Prior)
	}
	must(t, s.DeadLetter(ctx, "a", "w", "400 at turn 1"))
	rows := finished(t, s)
	if len(rows) != 1 || rows[0].State != store.Dead || rows[0].Attempts != 1 || rows[0].Reason != "400 at turn 1" {
		t.Errorf("Finished = %+v, want dead with 1 attempt and the reason", rows)
	}
}

func testCompleteTurnLease(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	claimOne(t, s, "short", "w1", "a")
	if n, err := s.ExpireLeases(ctx, time.Now().Add(2*lease)); err != nil || n != 1 {
		t.Fatalf("ExpireLeases = %d, %v; want 1, nil", n, err)
	}
	wantErr(t, "CompleteTurn after expiry", s.CompleteTurn(ctx, "a", "w1", turnResult("a", 0, "stop", 1, 1, 0), ""), store.ErrNotLeased)
	claimOne(t, s, "short", "w2", "a")
	wantErr(t, "CompleteTurn by the old owner", s.CompleteTurn(ctx, "a", "w1", turnResult("a", 0, "stop", 1, 1, 0), ""), store.ErrNotLeased)
	must(t, s.CompleteTurn(ctx, "a", "w2", turnResult("a", 0, "stop", 1, 1, 0), ""))
	// A release between turns keeps the turn.
	c := claimOne(t, s, "short", "w3", "a")
	must(t, s.Release(ctx, []string{"a"}, "w3"))
	if n, err := s.ReleaseOwner(ctx, "w3"); err != nil || n != 0 {
		t.Fatalf("ReleaseOwner = %d, %v", n, err)
	}
	c2 := claimOne(t, s, "short", "w4", "a")
	if c.Turn != 1 || c2.Turn != 1 || len(c2.Prior) != 1 {
		t.Errorf("turns after a release: %d then %d with %d prior, want 1, 1, 1", c.Turn, c2.Turn, len(c2.Prior))
	}
}

func testRequeueRejected(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c"))
	claim(t, s, "short", 3, "w")
	must(t, s.CompleteTurn(ctx, "a", "w", turnResult("a", 0, "stop", 5, 6, 0), ""))
	claimOne(t, s, "short", "w", "a")
	must(t, s.Reject(ctx, "a", "w", turnResult("a", 1, "length", 50, 100, 0), "truncated", "finish_reason length"))
	must(t, s.Reject(ctx, "b", "w", turnResult("b", 0, "stop", 5, 0, 0), "empty", "no content"))
	must(t, s.Complete(ctx, "c", "w", turnResult("c", 0, "stop", 5, 9, 0)))
	counts, err := s.RejectCounts(ctx)
	must(t, err)
	want := []store.RejectCount{rc("p", "short", "empty", 1), rc("p", "short", "truncated", 1)}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("RejectCounts (-want +got):\n%s", diff)
	}
	rows := finished(t, s)
	if len(rows) != 3 || rows[0].Rule != "truncated" || rows[0].Reason != "finish_reason length" || len(rows[0].Prior) != 1 {
		t.Fatalf("Finished = %+v; want a rejected with its rule, evidence and earlier turn", rows)
	}

	n, err := s.RequeueRejected(ctx, "truncated")
	if err != nil || n != 1 {
		t.Fatalf("RequeueRejected(truncated) = %d, %v; want 1", n, err)
	}
	wantStates(t, s, map[string]int{"p/short/pending": 1, "p/short/rejected": 1, "p/short/done": 1})
	c := claimOne(t, s, "short", "w", "a")
	if c.Turn != 1 || c.Attempts != 0 || len(c.Prior) != 1 {
		t.Errorf("requeued claim: turn %d, %d attempts, %d prior; want the rejected turn 1 again, 0 attempts, turn 0 kept", c.Turn, c.Attempts, len(c.Prior))
	}
	counts, err = s.RejectCounts(ctx)
	must(t, err)
	if diff := cmp.Diff([]store.RejectCount{rc("p", "short", "empty", 1)}, counts); diff != "" {
		t.Errorf("RejectCounts after requeue (-want +got):\n%s", diff)
	}
	must(t, s.Complete(ctx, "a", "w", turnResult("a", 1, "stop", 50, 60, 0)))
	if n, err := s.RequeueRejected(ctx, "nope"); err != nil || n != 0 {
		t.Errorf("RequeueRejected(unknown rule) = %d, %v; want 0", n, err)
	}
	if n, err := s.RequeueRejected(ctx, ""); err != nil || n != 1 {
		t.Errorf("RequeueRejected(all) = %d, %v; want 1", n, err)
	}
	wantStates(t, s, map[string]int{"p/short/pending": 1, "p/short/done": 2})
}

func testStats(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, append(samples("p", "short", "a", "b", "c"), samples("q", "long", "d")...))
	claim(t, s, "short", 3, "w")
	claim(t, s, "long", 1, "w")
	must(t, s.CompleteTurn(ctx, "a", "w", turnResult("a", 0, "stop", 10, 100, 30), "long"))
	must(t, s.Complete(ctx, "b", "w", turnResult("b", 0, "length", 10, 200, 0)))
	must(t, s.Reject(ctx, "c", "w", turnResult("c", 0, "stop", 20, 100, 0), "empty", "no content"))
	must(t, s.Complete(ctx, "d", "w", turnResult("d", 0, "stop", 7, 8, 8)))
	claimOne(t, s, "long", "w", "a")
	r := turnResult("a", 1, "stop", 130, 50, 10)
	r.EndReason = "ended"
	must(t, s.Complete(ctx, "a", "w", r))

	cells, err := s.StatCells(ctx)
	must(t, err)
	want := []store.StatCell{
		{Partition: "p", Lane: "long", Requests: 1, WithReasoning: 1, Ended: 1, PromptTokens: 130, CompletionTokens: 50, ReasoningTokens: 10},
		{Partition: "p", Lane: "short", Requests: 3, Truncated: 1, Rejected: 1, WithReasoning: 1, PromptTokens: 40, CompletionTokens: 400, ReasoningTokens: 30},
		{Partition: "q", Lane: "long", Requests: 1, WithReasoning: 1, PromptTokens: 7, CompletionTokens: 8, ReasoningTokens: 8},
	}
	if diff := cmp.Diff(want, cells); diff != "" {
		t.Errorf("StatCells (-want +got):\n%s", diff)
	}
	var tokens []store.TokenCount
	must(t, s.EachTokenCount(ctx, func(c store.TokenCount) error { tokens = append(tokens, c); return nil }))
	wantTokens := []store.TokenCount{
		tcount("p", "long", "completion", 50, 1), tcount("p", "long", "prompt", 130, 1),
		tcount("p", "short", "completion", 100, 2), tcount("p", "short", "completion", 200, 1),
		tcount("p", "short", "prompt", 10, 2), tcount("p", "short", "prompt", 20, 1),
		tcount("q", "long", "completion", 8, 1), tcount("q", "long", "prompt", 7, 1),
	}
	if diff := cmp.Diff(wantTokens, tokens); diff != "" {
		t.Errorf("EachTokenCount (-want +got):\n%s", diff)
	}
	stop := errors.New("stop")
	seen := 0
	if err := s.EachTokenCount(ctx, func(store.TokenCount) error { seen++; return stop }); !errors.Is(err, stop) || seen != 1 {
		t.Errorf("EachTokenCount stopping: err %v after %d calls, want the callback's error after 1", err, seen)
	}
	checkThroughputHistory(t, s)
	// The rate counts every answer's tokens, and samples once finished.
	tp, err := s.ThroughputSince(ctx, time.Now().Add(-time.Hour))
	must(t, err)
	if tp.Samples != 4 || tp.PromptTokens != 177 || tp.CompletionTokens != 458 || tp.First.IsZero() || tp.Last.Before(tp.First) {
		t.Errorf("ThroughputSince = %+v, want 4 samples, every answer's tokens (177, 458) and the span of the answers", tp)
	}

	// A requeued reject leaves the dataset statistics.
	if n, err := s.RequeueRejected(ctx, "empty"); err != nil || n != 1 {
		t.Fatalf("RequeueRejected = %d, %v", n, err)
	}
	cells, err = s.StatCells(ctx)
	must(t, err)
	want[1] = store.StatCell{Partition: "p", Lane: "short", Requests: 2, Truncated: 1, WithReasoning: 1, PromptTokens: 20, CompletionTokens: 300, ReasoningTokens: 30}
	if diff := cmp.Diff(want, cells); diff != "" {
		t.Errorf("StatCells after requeue (-want +got):\n%s", diff)
	}
	tokens = nil
	must(t, s.EachTokenCount(ctx, func(c store.TokenCount) error { tokens = append(tokens, c); return nil }))
	wantTokens = []store.TokenCount{
		tcount("p", "long", "completion", 50, 1), tcount("p", "long", "prompt", 130, 1),
		tcount("p", "short", "completion", 100, 1), tcount("p", "short", "completion", 200, 1),
		tcount("p", "short", "prompt", 10, 2),
		tcount("q", "long", "completion", 8, 1), tcount("q", "long", "prompt", 7, 1),
	}
	if diff := cmp.Diff(wantTokens, tokens); diff != "" {
		t.Errorf("EachTokenCount after requeue (-want +got):\n%s", diff)
	}
}

// checkThroughputHistory checks testStats' five answers in the history
// per minute and in buckets of any width.
func checkThroughputHistory(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	hist, err := s.ThroughputHistory(ctx)
	must(t, err)
	total := store.MinuteThroughput{}
	for i, m := range hist {
		if i > 0 && !m.Minute.After(hist[i-1].Minute) {
			t.Errorf("history not in minute order: %v after %v", m.Minute, hist[i-1].Minute)
		}
		if m.Minute.Second() != 0 || time.Since(m.Minute) > time.Hour {
			t.Errorf("minute %v is not a recent whole minute", m.Minute)
		}
		total.Requests += m.Requests
		total.PromptTokens += m.PromptTokens
		total.CompletionTokens += m.CompletionTokens
	}
	if total.Requests != 5 || total.PromptTokens != 177 || total.CompletionTokens != 458 {
		t.Errorf("history totals = %+v, want 5 answers, 177 prompt and 458 completion tokens", total)
	}
	// Buckets of any width from any start hold the same answers.
	since := time.Now().Add(-time.Hour)
	for _, w := range []time.Duration{time.Second, 7 * time.Second, 2 * time.Hour} {
		bs, err := s.ThroughputBuckets(ctx, since, w)
		must(t, err)
		sum := store.MinuteThroughput{}
		for i, b := range bs {
			if i > 0 && !b.Minute.After(bs[i-1].Minute) || b.Minute.Before(since) || b.Minute.Sub(since)%w != 0 {
				t.Errorf("buckets of %s: %v is out of order or not a bucket start from %v", w, b.Minute, since)
			}
			sum.Requests += b.Requests
			sum.PromptTokens += b.PromptTokens
			sum.CompletionTokens += b.CompletionTokens
		}
		if sum != total {
			t.Errorf("buckets of %s sum to %+v, want the history's %+v", w, sum, total)
		}
	}
	if bs, err := s.ThroughputBuckets(ctx, time.Now().Add(time.Hour), time.Second); err != nil || len(bs) != 0 {
		t.Errorf("buckets from the future = %+v, %v; want none", bs, err)
	}
}

func testIngestDuplicates(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := sample("p", "short", "a")
	ingest(t, s, []store.NewSample{a, sample("p", "short", "b")})
	// The same rows read again are no duplicates.
	if n, err := s.Ingest(ctx, []store.NewSample{a}); err != nil || n != 0 {
		t.Fatalf("re-ingest = %d, %v", n, err)
	}
	sameBody := a
	sameBody.Origin = "p.jsonl:99"
	otherBody := a
	otherBody.Origin, otherBody.Body = "p.jsonl:7", []byte(`{"messages":[{"role":"user","content":"other"}]}`)
	// Within one batch, the second row with an id is the duplicate.
	c1, c2 := sample("p", "short", "c"), sample("p", "short", "c")
	c2.Origin = "p.jsonl:c-again"
	for range 2 {
		if n, err := s.Ingest(ctx, []store.NewSample{sameBody, otherBody, c1, c2}); err != nil {
			t.Fatalf("Ingest: %v", err)
		} else if n > 1 {
			t.Fatalf("Ingest of duplicates inserted %d, want at most c", n)
		}
	}
	// Examples come in byte-wise origin order.
	d, err := s.IngestDuplicates(ctx, 2)
	must(t, err)
	want := store.Duplicates{Total: 3, SameContent: 2, Examples: []store.Duplicate{
		{ID: "a", Partition: "p", Origin: "p.jsonl:7", FirstOrigin: "p.jsonl:a", SameContent: false},
		{ID: "a", Partition: "p", Origin: "p.jsonl:99", FirstOrigin: "p.jsonl:a", SameContent: true},
	}}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("IngestDuplicates (-want +got):\n%s", diff)
	}
	wantStates(t, s, map[string]int{"p/short/pending": 3})
}
