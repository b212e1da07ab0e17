package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/regen-dev/regen/internal/store"
)

// Run runs the whole suite; open must return a fresh, empty store for each
// subtest, which the suite closes.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"IngestErrorsDedupe", testIngestErrorsDedupe},
		{"IngestErrorCountAndEach", testIngestErrorCountAndEach},
		{"EachIngestErrorStopsOnError", testEachIngestErrorStops},
		{"CompleteStoresResult", testCompleteStoresResult},
		{"CompleteWrongOwner", testCompleteWrongOwner},
		{"LostLeaseRefusesEveryTransition", testLostLease},
		{"Reject", testReject},
		{"RetrySpendsOneAttempt", testRetry},
		{"ReleaseOwnerKeepsAttempts", testReleaseOwner},
		{"RelaneKeepsTheLease", testRelane},
		{"DeadLetter", testDeadLetter},
		{"RequeueDead", testRequeueDead},
		{"ThroughputSince", testThroughputSince},
		{"LastErrors", testLastErrors},
		{"Heartbeat", testHeartbeat},
		{"Events", testEvents},
		{"FinishedPagesInIDOrder", testFinishedPaging},
		{"FinishedStopsOnError", testFinishedStops},
		// Many workers and big jobs.
		{"HeartbeatsPerWorker", testHeartbeatsPerWorker},
		{"EventsTaggedByWorker", testEventsTaggedByWorker},
		{"TryLock", testTryLock},
		{"SourceFiles", testSourceFiles},
		{"Info", testInfo},
		// Dashboard history and sample browser.
		{"Minutes", testMinutes},
		{"SampleLookup", testSampleLookup},
		{"SamplesListing", testSamplesListing},
		{"SampleTurns", testSampleTurns},
	}
	tests = append(tests, trainingTests...)
	tests = append(tests, configTests...)
	tests = append(tests, captureTests...)
	for _, q := range queueTests {
		tests = append(tests, struct {
			name string
			fn   func(t *testing.T, s store.Store)
		}{q.name, func(t *testing.T, s store.Store) { q.fn(t, asQueue(s)) }})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

const lease = time.Minute

// sample builds a NewSample whose body and origin are derived from id.
func sample(partition, lane, id string) store.NewSample {
	return store.NewSample{
		ID:           id,
		Partition:    partition,
		Lane:         lane,
		Body:         []byte(`{"messages":[{"role":"user","content":"` + id + `"}]}`),
		PromptTokens: len(id) + 10,
		Origin:       partition + ".jsonl:" + id,
	}
}

func samples(partition, lane string, ids ...string) []store.NewSample {
	out := make([]store.NewSample, len(ids))
	for i, id := range ids {
		out[i] = sample(partition, lane, id)
	}
	return out
}

func result(id string) store.Result {
	return store.Result{
		Response:         []byte(`{"content":"answer to ` + id + `"}`),
		FinishReason:     "stop",
		PromptTokens:     12,
		CompletionTokens: 34,
		Endpoint:         "http://127.0.0.1:30000",
		Duration:         1500 * time.Millisecond,
		TTFT:             120 * time.Millisecond,
	}
}

func ingest(t *testing.T, s QueueStore, in []store.NewSample) {
	t.Helper()
	n, err := s.Ingest(context.Background(), in)
	if err != nil {
		t.Fatalf("Ingest: %v", err)
	}
	if n != len(in) {
		t.Fatalf("Ingest inserted %d, want %d", n, len(in))
	}
}

func claim(t *testing.T, s QueueStore, lane string, n int, owner string) []store.Claimed {
	t.Helper()
	c, err := s.Claim(context.Background(), lane, n, owner, lease)
	if err != nil {
		t.Fatalf("Claim(%s, %d, %s): %v", lane, n, owner, err)
	}
	return c
}

func ids(cs []store.Claimed) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

// claimOne claims exactly the next sample of lane and checks its id.
func claimOne(t *testing.T, s QueueStore, lane, owner, want string) store.Claimed {
	t.Helper()
	c := claim(t, s, lane, 1, owner)
	if got := ids(c); !slices.Equal(got, []string{want}) {
		t.Fatalf("Claim(%s, 1, %s) = %v, want [%s]", lane, owner, got, want)
	}
	return c[0]
}

func counts(t *testing.T, s QueueStore) []store.Count {
	t.Helper()
	c, err := s.Counts(context.Background())
	if err != nil {
		t.Fatalf("Counts: %v", err)
	}
	return c
}

// stateOf returns the state count map keyed "partition/lane/state".
func stateOf(t *testing.T, s QueueStore) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, c := range counts(t, s) {
		if c.N != 0 {
			m[c.Partition+"/"+c.Lane+"/"+string(c.State)] = c.N
		}
	}
	return m
}

func wantStates(t *testing.T, s QueueStore, want map[string]int) {
	t.Helper()
	if diff := cmp.Diff(want, stateOf(t, s)); diff != "" {
		t.Errorf("Counts mismatch (-want +got):\n%s", diff)
	}
}

func finished(t *testing.T, s store.Dataset) []store.Row {
	t.Helper()
	var rows []store.Row
	if err := s.Finished(context.Background(), func(r store.Row) error {
		rows = append(rows, r)
		return nil
	}); err != nil {
		t.Fatalf("Finished: %v", err)
	}
	return rows
}

var ignoreFinishedAt = cmpopts.IgnoreFields(store.Row{}, "FinishedAt")

func wantNotLeased(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotLeased) {
		t.Errorf("%s: got error %v, want ErrNotLeased", what, err)
	}
}

func testIngestIdempotent(t *testing.T, s queue) {
	ctx := context.Background()
	steps := []struct {
		name string
		in   []store.NewSample
		want int
	}{
		{"new", samples("p", "short", "a", "b", "c"), 3},
		{"same again", samples("p", "short", "a", "b", "c"), 0},
		{"overlap", samples("p", "short", "c", "d"), 1},
		{"duplicate inside batch", samples("p", "short", "e", "e", "a"), 1},
		{"same id other partition", samples("q", "long", "a"), 0},
		{"empty", nil, 0},
	}
	for _, st := range steps {
		got, err := s.Ingest(ctx, st.in)
		if err != nil {
			t.Fatalf("%s: Ingest: %v", st.name, err)
		}
		if got != st.want {
			t.Errorf("%s: Ingest inserted %d, want %d", st.name, got, st.want)
		}
	}
	wantStates(t, s, map[string]int{"p/short/pending": 5})
	// The first ingest of an id wins: "a" keeps partition p and lane short.
	c := claim(t, s, "short", 10, "w")
	// Token is the backend's (a shared store's fencing token, TestFencingToken there).
	var want []store.Claimed
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		smp := sample("p", "short", id)
		want = append(want, store.Claimed{ID: id, Partition: "p", Lane: "short", Body: smp.Body, PromptTokens: smp.PromptTokens})
	}
	if diff := cmp.Diff(want, c, cmpopts.IgnoreFields(store.Claimed{}, "LeaseUntil", "Token", "Seq")); diff != "" {
		t.Errorf("claimed after ingest (-want +got):\n%s", diff)
	}
	// Seq follows the claim order (ingest order here).
	for i := 1; i < len(c); i++ {
		if c[i].Seq <= c[i-1].Seq {
			t.Errorf("claimed %s Seq %d after %s Seq %d: want increasing", c[i].ID, c[i].Seq, c[i-1].ID, c[i-1].Seq)
		}
	}
	if got := claim(t, s, "long", 10, "w"); len(got) != 0 {
		t.Errorf("Claim(long) = %v, want none", ids(got))
	}
}

func testIngestErrorsDedupe(t *testing.T, s store.Store) {
	ctx := context.Background()
	first := []store.IngestError{
		{Partition: "p", Origin: "a.jsonl:3", Field: "messages", Reason: "not an array"},
		{Partition: "p", Origin: "a.jsonl:7", Reason: "invalid JSON"},
	}
	second := []store.IngestError{
		{Partition: "p", Origin: "a.jsonl:3", Field: "other", Reason: "changed reason is ignored"},
		{Partition: "p", Origin: "a.jsonl:9", Field: "tools", Reason: "not an array"},
	}
	if err := s.AddIngestErrors(ctx, first); err != nil {
		t.Fatalf("AddIngestErrors: %v", err)
	}
	if err := s.AddIngestErrors(ctx, second); err != nil {
		t.Fatalf("AddIngestErrors: %v", err)
	}
	if err := s.AddIngestErrors(ctx, nil); err != nil {
		t.Fatalf("AddIngestErrors(nil): %v", err)
	}
	all := []store.IngestError{first[0], first[1], second[1]}
	for _, tc := range []struct {
		limit int
		want  []store.IngestError
	}{
		{0, all},
		{-1, all},
		{10, all},
		{2, all[:2]},
		{1, all[:1]},
	} {
		got, err := s.IngestErrors(ctx, tc.limit)
		if err != nil {
			t.Fatalf("IngestErrors(%d): %v", tc.limit, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("IngestErrors(%d) (-want +got):\n%s", tc.limit, diff)
		}
	}
}

func testIngestErrorCountAndEach(t *testing.T, s store.Store) {
	ctx := context.Background()
	n, err := s.IngestErrorCount(ctx)
	if err != nil || n != 0 {
		t.Fatalf("IngestErrorCount on an empty store = %d, %v; want 0, nil", n, err)
	}
	must(t, s.EachIngestError(ctx, func(e store.IngestError) error {
		t.Errorf("EachIngestError on an empty store visited %+v", e)
		return nil
	}))

	// More than two pages of any sensible size, recorded in an order that is
	// neither origin order nor reverse, in batches that repeat earlier
	// origins with other contents (ignored), plus an empty origin. They
	// come back in the order first recorded: ingest records source order.
	const n0 = 2503
	origin := func(i int) string { return fmt.Sprintf("in.jsonl:%d", (i*7919)%n0) }
	want := map[string]store.IngestError{}
	var order []string
	var batch []store.IngestError
	for i := range n0 {
		e := store.IngestError{Partition: fmt.Sprintf("p%d", i%3), Origin: origin(i), Field: "messages", Reason: fmt.Sprintf("bad %d", i)}
		want[e.Origin] = e
		order = append(order, e.Origin)
		batch = append(batch, e)
		if i > 0 && i%400 == 0 {
			// Re-send one already recorded row of its partition, changed: the
			// first one stays (another partition's would be its own row).
			batch = append(batch, store.IngestError{Partition: fmt.Sprintf("p%d", (i-1)%3), Origin: origin(i - 1), Reason: "duplicate"})
			must(t, s.AddIngestErrors(ctx, batch))
			batch = nil
		}
	}
	empty := store.IngestError{Partition: "p0", Reason: "row as a whole"}
	want[""] = empty
	order = append(order, "")
	batch = append(batch, empty, store.IngestError{Partition: "p2", Origin: origin(5), Reason: "duplicate"})
	must(t, s.AddIngestErrors(ctx, batch))

	n, err = s.IngestErrorCount(ctx)
	if err != nil {
		t.Fatalf("IngestErrorCount: %v", err)
	}
	if n != len(want) {
		t.Errorf("IngestErrorCount = %d, want %d (duplicates not counted)", n, len(want))
	}

	var wantList []store.IngestError
	for _, o := range order {
		wantList = append(wantList, want[o])
	}
	var got []store.IngestError
	err = s.EachIngestError(ctx, func(e store.IngestError) error {
		got = append(got, e)
		// The callback may use the store: EachIngestError holds nothing while it runs.
		if len(got)%700 == 0 {
			if _, err := s.IngestErrorCount(ctx); err != nil {
				return err
			}
			return s.AddEvent(ctx, store.Event{Kind: "export", Subject: e.Origin})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("EachIngestError: %v", err)
	}
	if diff := cmp.Diff(wantList, got); diff != "" {
		t.Errorf("EachIngestError (-want +got):\n%s", diff)
	}
}

func testEachIngestErrorStops(t *testing.T, s store.Store) {
	ctx := context.Background()
	must(t, s.AddIngestErrors(ctx, []store.IngestError{
		{Partition: "p", Origin: "c:1", Reason: "x"},
		{Partition: "p", Origin: "a:1", Reason: "x"},
		{Partition: "p", Origin: "b:1", Reason: "x"},
	}))
	stop := errors.New("stop here")
	var seen []string
	err := s.EachIngestError(ctx, func(e store.IngestError) error {
		seen = append(seen, e.Origin)
		if e.Origin == "a:1" {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Errorf("EachIngestError error = %v, want %v", err, stop)
	}
	if diff := cmp.Diff([]string{"c:1", "a:1"}, seen); diff != "" { // recorded order, stopped at a:1
		t.Errorf("visited (-want +got):\n%s", diff)
	}
}

func testClaimLaneLimitOrder(t *testing.T, s queue) {
	// Interleaved lanes and ids that sort differently from insertion order:
	// claims follow ingestion order within a lane.
	ingest(t, s, []store.NewSample{
		sample("p", "short", "s9"), sample("p", "long", "l5"), sample("p", "short", "s1"),
		sample("q", "short", "s5"), sample("p", "long", "l1"), sample("p", "short", "s0"),
	})
	before := time.Now()
	steps := []struct {
		lane, owner string
		n           int
		want        []string
	}{
		{"short", "w1", 0, nil},
		{"short", "w1", 2, []string{"s9", "s1"}},
		{"long", "w2", 1, []string{"l5"}},
		{"short", "w2", 10, []string{"s5", "s0"}},
		{"short", "w1", 10, nil},
		{"long", "w1", 10, []string{"l1"}},
		{"none", "w1", 10, nil},
	}
	for _, st := range steps {
		got := claim(t, s, st.lane, st.n, st.owner)
		if diff := cmp.Diff(st.want, ids(got), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Claim(%s, %d) ids (-want +got):\n%s", st.lane, st.n, diff)
		}
		for _, c := range got {
			if c.Lane != st.lane {
				t.Errorf("claimed %s has lane %q, want %q", c.ID, c.Lane, st.lane)
			}
			if c.Attempts != 0 {
				t.Errorf("claimed %s has %d attempts, want 0", c.ID, c.Attempts)
			}
			if lo, hi := before.Add(lease), time.Now().Add(lease); c.LeaseUntil.Before(lo.Add(-time.Second)) || c.LeaseUntil.After(hi.Add(time.Second)) {
				t.Errorf("claimed %s lease until %v, want about now+%v (%v..%v)", c.ID, c.LeaseUntil, lease, lo, hi)
			}
		}
	}
	wantStates(t, s, map[string]int{"p/short/leased": 3, "p/long/leased": 2, "q/short/leased": 1})
}

func testClaimNotBefore(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c", "d"))
	claim(t, s, "short", 3, "w")
	now := time.Now()
	must(t, s.Retry(ctx, "a", "w", now.Add(time.Hour), "503"))
	// c became due before b, but b is older: claims go by age, not due time.
	must(t, s.Retry(ctx, "c", "w", now.Add(-2*time.Second), "timeout"))
	must(t, s.Retry(ctx, "b", "w", now.Add(-time.Second), "timeout"))
	for _, st := range []struct {
		n    int
		want []string
	}{
		{1, []string{"b"}},
		{1, []string{"c"}},
		{10, []string{"d"}}, // a waits an hour
		{10, nil},
	} {
		got := claim(t, s, "short", st.n, "w2")
		if diff := cmp.Diff(st.want, ids(got), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Claim(%d) after retries (-want +got):\n%s", st.n, diff)
		}
		for _, c := range got {
			if want := map[string]int{"b": 1, "c": 1, "d": 0}[c.ID]; c.Attempts != want {
				t.Errorf("%s has %d attempts, want %d", c.ID, c.Attempts, want)
			}
		}
	}
	wantStates(t, s, map[string]int{"p/short/pending": 1, "p/short/leased": 3})
}

func testExtendLeases(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c"))
	claim(t, s, "short", 2, "w1")
	claim(t, s, "short", 1, "w2")
	if err := s.ExtendLeases(ctx, "w1", 2*time.Hour); err != nil {
		t.Fatalf("ExtendLeases: %v", err)
	}
	if err := s.ExtendLeases(ctx, "nobody", time.Hour); err != nil {
		t.Fatalf("ExtendLeases(nobody): %v", err)
	}
	// Past w2's lease but inside w1's extended one.
	n, err := s.ExpireLeases(ctx, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatalf("ExpireLeases: %v", err)
	}
	if n != 1 {
		t.Errorf("ExpireLeases(now+1h) = %d, want 1 (only w2's)", n)
	}
	claimOne(t, s, "short", "w3", "c")
	if err := s.Complete(ctx, "a", "w1", result("a")); err != nil {
		t.Errorf("Complete by w1 after extension: %v", err)
	}
	n, err = s.ExpireLeases(ctx, time.Now().Add(3*time.Hour))
	if err != nil {
		t.Fatalf("ExpireLeases: %v", err)
	}
	if n != 2 {
		t.Errorf("ExpireLeases(now+3h) = %d, want 2 (b and c)", n)
	}
}

func testCompleteStoresResult(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b"))
	claimOne(t, s, "short", "w", "a")
	before := time.Now()
	if err := s.Complete(ctx, "a", "w", result("a")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	after := time.Now()
	rows := finished(t, s)
	want := []store.Row{{
		ID: "a", Partition: "p", Lane: "short", State: store.Done,
		Body: sample("p", "short", "a").Body, Attempts: 1, Result: result("a"), Origin: sample("p", "short", "a").Origin,
	}}
	if diff := cmp.Diff(want, rows, ignoreFinishedAt); diff != "" {
		t.Fatalf("Finished (-want +got):\n%s", diff)
	}
	if at := rows[0].FinishedAt; at.Before(before.Add(-time.Second)) || at.After(after.Add(time.Second)) {
		t.Errorf("FinishedAt = %v, want between %v and %v", at, before, after)
	}
	wantStates(t, s, map[string]int{"p/short/done": 1, "p/short/pending": 1})
	// A finished sample holds no lease: a second verdict is refused.
	wantNotLeased(t, "second Complete", s.Complete(ctx, "a", "w", result("again")))
	wantNotLeased(t, "Retry after Complete", s.Retry(ctx, "a", "w", time.Now(), "x"))
	wantNotLeased(t, "Complete of pending b", s.Complete(ctx, "b", "w", result("b")))
	wantNotLeased(t, "Complete of unknown id", s.Complete(ctx, "zz", "w", result("zz")))
	if diff := cmp.Diff(want, finished(t, s), ignoreFinishedAt); diff != "" {
		t.Errorf("Finished after refused calls (-want +got):\n%s", diff)
	}
	wantStates(t, s, map[string]int{"p/short/done": 1, "p/short/pending": 1})
}

func testCompleteWrongOwner(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	claimOne(t, s, "short", "w1", "a")
	wantNotLeased(t, "Complete by w2", s.Complete(ctx, "a", "w2", result("a")))
	wantNotLeased(t, "Reject by w2", s.Reject(ctx, "a", "w2", result("a"), "empty", "bad"))
	wantNotLeased(t, "Retry by w2", s.Retry(ctx, "a", "w2", time.Now(), "x"))
	wantNotLeased(t, "DeadLetter by w2", s.DeadLetter(ctx, "a", "w2", "x"))
	wantNotLeased(t, "Escalate by w2", s.Escalate(ctx, "a", "w2", "long"))
	if n, err := s.ReleaseOwner(ctx, "w2"); err != nil || n != 0 {
		t.Errorf("ReleaseOwner(w2) = %d, %v; want 0, nil", n, err)
	}
	if err := s.Release(ctx, []string{"a"}, "w2"); err != nil {
		t.Errorf("Release by w2: %v", err)
	}
	if rows := finished(t, s); len(rows) != 0 {
		t.Errorf("Finished after refused calls = %d rows, want 0", len(rows))
	}
	wantStates(t, s, map[string]int{"p/short/leased": 1})
	if err := s.Complete(ctx, "a", "w1", result("a")); err != nil {
		t.Fatalf("Complete by the holder: %v", err)
	}
	if rows := finished(t, s); len(rows) != 1 || rows[0].Attempts != 1 {
		t.Errorf("Finished = %+v, want one row with 1 attempt", rows)
	}
}

func testLostLease(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	claimOne(t, s, "short", "w1", "a")
	if n, err := s.ExpireLeases(ctx, time.Now().Add(2*lease)); err != nil || n != 1 {
		t.Fatalf("ExpireLeases = %d, %v; want 1, nil", n, err)
	}
	// Expired but not yet reclaimed: the old holder still cannot finish it.
	wantNotLeased(t, "Complete after expiry", s.Complete(ctx, "a", "w1", result("w1")))
	claimOne(t, s, "short", "w2", "a")
	wantNotLeased(t, "Complete by old owner", s.Complete(ctx, "a", "w1", result("w1")))
	wantNotLeased(t, "Reject by old owner", s.Reject(ctx, "a", "w1", result("w1"), "empty", "bad"))
	wantNotLeased(t, "Retry by old owner", s.Retry(ctx, "a", "w1", time.Now(), "x"))
	wantNotLeased(t, "DeadLetter by old owner", s.DeadLetter(ctx, "a", "w1", "x"))
	wantNotLeased(t, "Escalate by old owner", s.Escalate(ctx, "a", "w1", "long"))
	if err := s.Release(ctx, []string{"a"}, "w1"); err != nil {
		t.Errorf("Release by old owner: %v", err)
	}
	if n, err := s.ReleaseOwner(ctx, "w1"); err != nil || n != 0 {
		t.Errorf("ReleaseOwner(old owner) = %d, %v; want 0, nil", n, err)
	}
	wantStates(t, s, map[string]int{"p/short/leased": 1})
	if err := s.Complete(ctx, "a", "w2", result("w2")); err != nil {
		t.Fatalf("Complete by new owner: %v", err)
	}
	rows := finished(t, s)
	if len(rows) != 1 {
		t.Fatalf("Finished = %d rows, want 1", len(rows))
	}
	if diff := cmp.Diff(result("w2"), rows[0].Result); diff != "" {
		t.Errorf("stored result (-want +got):\n%s", diff)
	}
	if rows[0].Attempts != 1 {
		t.Errorf("Attempts = %d, want 1 (expiry spends none)", rows[0].Attempts)
	}
}

func testReject(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	claimOne(t, s, "short", "w", "a")
	if err := s.Reject(ctx, "a", "w", result("a"), "empty", "empty content"); err != nil {
		t.Fatalf("Reject: %v", err)
	}
	want := []store.Row{{
		ID: "a", Partition: "p", Lane: "short", State: store.Rejected,
		Body: sample("p", "short", "a").Body, Attempts: 1, Result: result("a"), Reason: "empty content", Rule: "empty",
		Origin: sample("p", "short", "a").Origin,
	}}
	if diff := cmp.Diff(want, finished(t, s), ignoreFinishedAt); diff != "" {
		t.Errorf("Finished (-want +got):\n%s", diff)
	}
	wantStates(t, s, map[string]int{"p/short/rejected": 1})
	wantNotLeased(t, "Complete after Reject", s.Complete(ctx, "a", "w", result("a")))
}

func testRetry(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	for want := 0; want < 3; want++ {
		c := claimOne(t, s, "short", "w", "a")
		if c.Attempts != want {
			t.Fatalf("claim %d: Attempts = %d, want %d", want, c.Attempts, want)
		}
		if err := s.Retry(ctx, "a", "w", time.Now().Add(-time.Millisecond), fmt.Sprintf("error %d", want)); err != nil {
			t.Fatalf("Retry %d: %v", want, err)
		}
		wantNotLeased(t, "Retry twice", s.Retry(ctx, "a", "w", time.Now(), "again"))
	}
	errs, err := s.LastErrors(ctx, 10)
	if err != nil {
		t.Fatalf("LastErrors: %v", err)
	}
	if len(errs) != 1 || errs[0].ID != "a" || errs[0].Reason != "error 2" || errs[0].Attempts != 3 || errs[0].State != store.Pending {
		t.Errorf("LastErrors = %+v, want a pending with reason %q and 3 attempts", errs, "error 2")
	}
	c := claimOne(t, s, "short", "w", "a")
	if c.Attempts != 3 {
		t.Errorf("Attempts after 3 retries = %d, want 3", c.Attempts)
	}
	if err := s.Complete(ctx, "a", "w", result("a")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if rows := finished(t, s); len(rows) != 1 || rows[0].Attempts != 4 || rows[0].Reason != "" {
		t.Errorf("Finished = %+v, want a done with 4 attempts and no reason", rows)
	}
}

func testRelease(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c"))
	claim(t, s, "short", 3, "w")
	if err := s.Complete(ctx, "c", "w", result("c")); err != nil {
		t.Fatalf("Complete c: %v", err)
	}
	// c is finished and "zz" unknown: both are skipped, a and b released.
	if err := s.Release(ctx, []string{"a", "b", "c", "zz"}, "w"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := s.Release(ctx, nil, "w"); err != nil {
		t.Fatalf("Release(nil): %v", err)
	}
	wantStates(t, s, map[string]int{"p/short/pending": 2, "p/short/done": 1})
	wantNotLeased(t, "Complete after Release", s.Complete(ctx, "a", "w", result("a")))
	for _, c := range claim(t, s, "short", 10, "w2") {
		if c.Attempts != 0 {
			t.Errorf("%s: Attempts after Release = %d, want 0", c.ID, c.Attempts)
		}
	}
}

func testReleaseOwner(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c"))
	claim(t, s, "short", 2, "dead")
	claim(t, s, "short", 1, "alive")
	n, err := s.ReleaseOwner(ctx, "dead")
	if err != nil {
		t.Fatalf("ReleaseOwner: %v", err)
	}
	if n != 2 {
		t.Errorf("ReleaseOwner = %d, want 2", n)
	}
	wantStates(t, s, map[string]int{"p/short/pending": 2, "p/short/leased": 1})
	got := claim(t, s, "short", 10, "w")
	if diff := cmp.Diff([]string{"a", "b"}, ids(got)); diff != "" {
		t.Errorf("reclaimed (-want +got):\n%s", diff)
	}
	for _, c := range got {
		if c.Attempts != 0 {
			t.Errorf("%s: Attempts after ReleaseOwner = %d, want 0", c.ID, c.Attempts)
		}
	}
	if err := s.Complete(ctx, "c", "alive", result("c")); err != nil {
		t.Errorf("Complete by the other owner: %v", err)
	}
}

func testEscalate(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b"))
	ingest(t, s, samples("p", "long", "l"))
	claimOne(t, s, "short", "w", "a")
	if err := s.Retry(ctx, "a", "w", time.Now().Add(-time.Second), "503"); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	claimOne(t, s, "short", "w", "a")
	if err := s.Escalate(ctx, "a", "w", "long"); err != nil {
		t.Fatalf("Escalate: %v", err)
	}
	wantNotLeased(t, "Escalate twice", s.Escalate(ctx, "a", "w", "long"))
	wantStates(t, s, map[string]int{"p/short/pending": 1, "p/long/pending": 2})
	if got := ids(claim(t, s, "short", 10, "w")); !slices.Equal(got, []string{"b"}) {
		t.Errorf("Claim(short) = %v, want [b]", got)
	}
	// a was ingested before l, so it keeps its place in the new lane.
	got := claim(t, s, "long", 10, "w")
	if diff := cmp.Diff([]string{"a", "l"}, ids(got)); diff != "" {
		t.Fatalf("Claim(long) (-want +got):\n%s", diff)
	}
	if got[0].Lane != "long" || got[0].Attempts != 1 {
		t.Errorf("escalated a: lane %q attempts %d, want long and 1", got[0].Lane, got[0].Attempts)
	}
}

func testRelane(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b"))
	claimOne(t, s, "short", "w", "a")
	wantNotLeased(t, "Relane by w2", s.Relane(ctx, "a", "w2", "long"))
	wantNotLeased(t, "Relane of pending b", s.Relane(ctx, "b", "w", "long"))
	if err := s.Relane(ctx, "a", "w", "long"); err != nil {
		t.Fatalf("Relane: %v", err)
	}
	wantStates(t, s, map[string]int{"p/long/leased": 1, "p/short/pending": 1})
	if got := claim(t, s, "long", 10, "w2"); len(got) != 0 {
		t.Errorf("Claim(long) = %v, want nothing: a is still leased to w", ids(got))
	}
	// The holder stores the answer it has for the new lane; the statistics
	// count it there.
	if err := s.Complete(ctx, "a", "w", result("a")); err != nil {
		t.Fatalf("Complete after Relane: %v", err)
	}
	rows := finished(t, s)
	if len(rows) != 1 || rows[0].Lane != "long" || rows[0].Attempts != 1 {
		t.Fatalf("Finished = %+v, want a done in long after 1 attempt", rows)
	}
	wantStates(t, s, map[string]int{"p/long/done": 1, "p/short/pending": 1})
	cells, err := s.StatCells(ctx)
	if err != nil {
		t.Fatalf("StatCells: %v", err)
	}
	if len(cells) != 1 || cells[0].Lane != "long" || cells[0].Requests != 1 {
		t.Errorf("StatCells = %+v, want one answer counted in lane long", cells)
	}
}

func testDeadLetter(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b"))
	claimOne(t, s, "short", "w", "a")
	if err := s.Retry(ctx, "a", "w", time.Now().Add(-time.Second), "503"); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	claimOne(t, s, "short", "w", "a")
	if err := s.DeadLetter(ctx, "a", "w", "400: context length exceeded"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	wantNotLeased(t, "DeadLetter twice", s.DeadLetter(ctx, "a", "w", "again"))
	wantNotLeased(t, "Complete after DeadLetter", s.Complete(ctx, "a", "w", result("a")))
	want := []store.Row{{
		ID: "a", Partition: "p", Lane: "short", State: store.Dead,
		Body: sample("p", "short", "a").Body, Attempts: 2, Reason: "400: context length exceeded",
		// A dead letter made at dispatch names the row it came from, as
		// one made at ingest does.
		Origin: "p.jsonl:a",
	}}
	rows := finished(t, s)
	if diff := cmp.Diff(want, rows, ignoreFinishedAt); diff != "" {
		t.Errorf("Finished (-want +got):\n%s", diff)
	}
	if len(rows) == 1 && rows[0].FinishedAt.IsZero() {
		t.Errorf("dead sample has zero FinishedAt")
	}
	wantStates(t, s, map[string]int{"p/short/dead": 1, "p/short/pending": 1})
	tp, err := s.ThroughputSince(ctx, time.Time{})
	if err != nil {
		t.Fatalf("ThroughputSince: %v", err)
	}
	if tp != (store.Throughput{}) {
		t.Errorf("ThroughputSince with only a dead sample = %+v, want zero", tp)
	}
}

func testRequeueDead(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c", "d"))
	for _, tc := range []struct{ id, reason string }{
		{"a", "404: the model 'x' does not exist"},
		{"b", "400: unknown parameter top_k"},
		{"c", "400: unknown parameter top_k"},
	} {
		claimOne(t, s, "short", "w", tc.id)
		if err := s.DeadLetter(ctx, tc.id, "w", tc.reason); err != nil {
			t.Fatalf("DeadLetter %s: %v", tc.id, err)
		}
	}
	n, err := s.RequeueDead(ctx, "top_k")
	if err != nil || n != 2 {
		t.Fatalf("RequeueDead(top_k) = %d, %v; want 2", n, err)
	}
	wantStates(t, s, map[string]int{"p/short/dead": 1, "p/short/pending": 3})
	// Requeued samples come back with a clean slate: no attempts, no error.
	got := claim(t, s, "short", 10, "w2")
	if len(got) != 3 {
		t.Fatalf("claimed %d after requeue, want 3 (b, c, d)", len(got))
	}
	for _, c := range got {
		if c.Attempts != 0 {
			t.Errorf("sample %s has %d attempts after requeue, want 0", c.ID, c.Attempts)
		}
	}
	if n, err := s.RequeueDead(ctx, ""); err != nil || n != 1 {
		t.Fatalf("RequeueDead(all) = %d, %v; want 1 (a)", n, err)
	}
	if n, err := s.RequeueDead(ctx, ""); err != nil || n != 0 {
		t.Fatalf("RequeueDead again = %d, %v; want 0", n, err)
	}
	if rows := finished(t, s); len(rows) != 0 {
		t.Errorf("Finished after requeueing every dead sample = %d rows, want 0", len(rows))
	}
}

func testExpireLeases(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c", "d"))
	if _, err := s.Claim(ctx, "short", 1, "w1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "short", 2, "w2", time.Hour); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		at   time.Duration
		want int
	}{
		{-time.Hour, 0},
		{30 * time.Second, 0},
		{2 * time.Minute, 1},
		{2 * time.Minute, 0},
		{2 * time.Hour, 2},
		{3 * time.Hour, 0},
	}
	for _, st := range steps {
		n, err := s.ExpireLeases(ctx, time.Now().Add(st.at))
		if err != nil {
			t.Fatalf("ExpireLeases(now%+v): %v", st.at, err)
		}
		if n != st.want {
			t.Errorf("ExpireLeases(now%+v) = %d, want %d", st.at, n, st.want)
		}
	}
	got := claim(t, s, "short", 10, "w3")
	if diff := cmp.Diff([]string{"a", "b", "c", "d"}, ids(got)); diff != "" {
		t.Errorf("claim after expiry (-want +got):\n%s", diff)
	}
	for _, c := range got {
		if c.Attempts != 0 {
			t.Errorf("%s: Attempts after expiry = %d, want 0", c.ID, c.Attempts)
		}
	}
}

func testCounts(t *testing.T, s queue) {
	ctx := context.Background()
	wantStates(t, s, map[string]int{})
	ingest(t, s, samples("p", "short", "p1", "p2", "p3", "p4", "p5", "p6"))
	ingest(t, s, samples("q", "short", "q1", "q2"))
	ingest(t, s, samples("q", "long", "q3"))
	claim(t, s, "short", 5, "w") // p1..p5
	must(t, s.Complete(ctx, "p1", "w", result("p1")))
	must(t, s.Reject(ctx, "p2", "w", result("p2"), "empty", "bad"))
	must(t, s.DeadLetter(ctx, "p3", "w", "400"))
	must(t, s.Escalate(ctx, "p4", "w", "long"))
	want := map[string]int{
		"p/short/done": 1, "p/short/rejected": 1, "p/short/dead": 1, "p/short/leased": 1, "p/short/pending": 1,
		"p/long/pending": 1, "q/short/pending": 2, "q/long/pending": 1,
	}
	wantStates(t, s, want)
	got := counts(t, s)
	sorted := slices.IsSortedFunc(got, func(a, b store.Count) int {
		return cmpStrings(a.Partition+"\x00"+a.Lane+"\x00"+string(a.State), b.Partition+"\x00"+b.Lane+"\x00"+string(b.State))
	})
	if !sorted {
		t.Errorf("Counts not sorted by partition, lane, state: %+v", got)
	}
	for _, c := range got {
		if c.N <= 0 {
			t.Errorf("Counts has empty cell %+v", c)
		}
	}
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testThroughputSince(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c", "d"))
	claim(t, s, "short", 4, "w")
	before := time.Now().Add(-time.Second)
	must(t, s.Complete(ctx, "a", "w", store.Result{FinishReason: "stop", PromptTokens: 10, CompletionTokens: 100}))
	must(t, s.Reject(ctx, "b", "w", store.Result{FinishReason: "length", PromptTokens: 20, CompletionTokens: 200}, "truncated", "finish_reason length"))
	must(t, s.DeadLetter(ctx, "c", "w", "400"))
	must(t, s.Retry(ctx, "d", "w", time.Now(), "503"))
	after := time.Now().Add(time.Second)
	for _, tc := range []struct {
		name  string
		since time.Time
		want  store.Throughput
	}{
		{"all time", time.Time{}, store.Throughput{Samples: 2, CompletionTokens: 300, PromptTokens: 30}},
		{"since before", before, store.Throughput{Samples: 2, CompletionTokens: 300, PromptTokens: 30}},
		{"future", time.Now().Add(time.Hour), store.Throughput{}},
	} {
		got, err := s.ThroughputSince(ctx, tc.since)
		if err != nil {
			t.Fatalf("%s: ThroughputSince: %v", tc.name, err)
		}
		first, last := got.First, got.Last
		got.First, got.Last = time.Time{}, time.Time{}
		if got != tc.want {
			t.Errorf("%s: ThroughputSince = %+v, want %+v", tc.name, got, tc.want)
		}
		// First and Last bracket the results counted: the finish stamps of a and b.
		switch {
		case tc.want.Samples == 0 && (!first.IsZero() || !last.IsZero()):
			t.Errorf("%s: First, Last = %v, %v; want zero with nothing counted", tc.name, first, last)
		case tc.want.Samples > 0 && (first.Before(before) || last.Before(first) || last.After(after)):
			t.Errorf("%s: First, Last = %v, %v; want %v <= First <= Last <= %v", tc.name, first, last, before, after)
		}
	}
}

func testLastErrors(t *testing.T, s store.Store) {
	ctx := context.Background()
	got, err := s.LastErrors(ctx, 10)
	if err != nil || len(got) != 0 {
		t.Fatalf("LastErrors on empty store = %v, %v; want none", got, err)
	}
	ingest(t, s, samples("p", "short", "a", "b", "c", "d"))
	claim(t, s, "short", 4, "w")
	must(t, s.Retry(ctx, "a", "w", time.Now().Add(time.Hour), "503 first"))
	time.Sleep(2 * time.Millisecond) // distinct timestamps on coarse clocks
	must(t, s.DeadLetter(ctx, "b", "w", "400 second"))
	time.Sleep(2 * time.Millisecond)
	must(t, s.Retry(ctx, "c", "w", time.Now().Add(time.Hour), "timeout third"))
	must(t, s.Complete(ctx, "d", "w", result("d")))
	for _, tc := range []struct {
		limit int
		want  []string
	}{
		{10, []string{"c:timeout third:pending", "b:400 second:dead", "a:503 first:pending"}},
		{0, []string{"c:timeout third:pending", "b:400 second:dead", "a:503 first:pending"}},
		{2, []string{"c:timeout third:pending", "b:400 second:dead"}},
	} {
		rows, err := s.LastErrors(ctx, tc.limit)
		if err != nil {
			t.Fatalf("LastErrors(%d): %v", tc.limit, err)
		}
		var got []string
		for _, r := range rows {
			got = append(got, r.ID+":"+r.Reason+":"+string(r.State))
			if r.Partition != "p" || r.Lane != "short" || r.Attempts != 1 {
				t.Errorf("LastErrors row %+v: want partition p, lane short, 1 attempt", r)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("LastErrors(%d) (-want +got):\n%s", tc.limit, diff)
		}
	}
}

func testHeartbeat(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, ok, err := s.LastHeartbeat(ctx); err != nil || ok {
		t.Fatalf("LastHeartbeat on empty store: ok=%v err=%v, want false, nil", ok, err)
	}
	started := time.Date(2025, 3, 1, 10, 0, 0, 123456789, time.UTC)
	for i, hb := range []store.Heartbeat{
		{Owner: "runner-1", PID: 4242, Host: "gpu01", Time: started.Add(5 * time.Second), Started: started, Counters: []byte(`{"done":1}`)},
		{Owner: "runner-1", PID: 4242, Host: "gpu01", Time: started.Add(10 * time.Second), Started: started, Counters: []byte(`{"done":7}`)},
		{Owner: "runner-2", PID: 99, Host: "gpu02", Time: started.Add(time.Hour), Started: started.Add(50 * time.Minute)},
	} {
		must(t, s.PutHeartbeat(ctx, hb))
		got, ok, err := s.LastHeartbeat(ctx)
		if err != nil || !ok {
			t.Fatalf("LastHeartbeat %d: ok=%v err=%v", i, ok, err)
		}
		if diff := cmp.Diff(hb, got); diff != "" {
			t.Errorf("LastHeartbeat %d (-want +got):\n%s", i, diff)
		}
	}
}

func testEvents(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	var all []store.Event
	for i := range 5 {
		e := store.Event{
			// Times deliberately not monotonic: order is insertion order.
			Time: base.Add(time.Duration((i*7)%5) * time.Second), Kind: "endpoint_state",
			Subject: fmt.Sprintf("http://127.0.0.1:%d", 30000+i), State: "down", Evidence: fmt.Sprintf("exit code %d", i),
		}
		must(t, s.AddEvent(ctx, e))
		all = append([]store.Event{e}, all...)
	}
	for _, tc := range []struct {
		limit int
		want  []store.Event
	}{
		{0, all},
		{10, all},
		{3, all[:3]},
		{1, all[:1]},
	} {
		got, err := s.Events(ctx, tc.limit)
		if err != nil {
			t.Fatalf("Events(%d): %v", tc.limit, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Events(%d) (-want +got):\n%s", tc.limit, diff)
		}
	}
}

func testFinishedPaging(t *testing.T, s store.Store) {
	ctx := context.Background()
	// More than one page of any sensible size, ingested in reverse id order,
	// with one pending sample that must not appear.
	const n = 1203
	var in []store.NewSample
	for i := n - 1; i >= 0; i-- {
		in = append(in, sample("p", "short", fmt.Sprintf("id%05d", i)))
	}
	in = append(in, sample("p", "short", "id00500x"))
	ingest(t, s, in)
	var want []string
	for {
		cs := claim(t, s, "short", 100, "w")
		if len(cs) == 0 {
			break
		}
		for _, c := range cs {
			var err error
			switch {
			case c.ID == "id00500x":
				err = s.Release(ctx, []string{c.ID}, "w")
			case len(want)%3 == 0:
				err = s.Complete(ctx, c.ID, "w", result(c.ID))
			case len(want)%3 == 1:
				err = s.Reject(ctx, c.ID, "w", result(c.ID), "empty", "bad")
			default:
				err = s.DeadLetter(ctx, c.ID, "w", "400")
			}
			must(t, err)
			if c.ID != "id00500x" {
				want = append(want, c.ID)
			}
		}
		if len(want) == n {
			break
		}
	}
	slices.Sort(want)
	var got []string
	err := s.Finished(ctx, func(r store.Row) error {
		got = append(got, r.ID)
		// The callback may use the store: Finished holds nothing while it runs.
		if len(got)%500 == 0 {
			if _, err := s.Counts(ctx); err != nil {
				return err
			}
			return s.AddEvent(ctx, store.Event{Kind: "export", Subject: r.ID})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Finished: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Finished ids (-want +got):\n%s", diff)
	}
}

func testFinishedStops(t *testing.T, s store.Store) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c"))
	claim(t, s, "short", 3, "w")
	for _, id := range []string{"a", "b", "c"} {
		must(t, s.Complete(ctx, id, "w", result(id)))
	}
	stop := errors.New("stop here")
	var seen []string
	err := s.Finished(ctx, func(r store.Row) error {
		seen = append(seen, r.ID)
		if r.ID == "b" {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Errorf("Finished returned %v, want the callback's error", err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, seen); diff != "" {
		t.Errorf("rows seen before stopping (-want +got):\n%s", diff)
	}
}

func testConcurrentClaimers(t *testing.T, s queue) {
	const (
		total   = 2000
		workers = 8
	)
	var in []store.NewSample
	for i := range total {
		lane := "short"
		if i%4 == 0 {
			lane = "long"
		}
		in = append(in, sample("p", lane, fmt.Sprintf("s%05d", i)))
	}
	c := &claimers{holder: map[string]string{}, completed: map[string]int{}, ingested: make(chan struct{})}
	var wg sync.WaitGroup
	// Ingest in chunks, concurrently with the claimers.
	wg.Go(func() {
		defer close(c.ingested)
		for i := 0; i < total; i += 250 {
			if _, err := s.Ingest(context.Background(), in[i:min(i+250, total)]); err != nil {
				t.Errorf("Ingest: %v", err)
				return
			}
		}
	})
	for w := range workers {
		lane := "short"
		if w%2 == 1 {
			lane = "long"
		}
		wg.Go(func() { c.work(t, s, fmt.Sprintf("worker-%d", w), lane) })
	}
	wg.Wait()
	for _, smp := range in {
		if n := c.completed[smp.ID]; n != 1 {
			t.Errorf("%s completed %d times, want 1", smp.ID, n)
		}
	}
	wantStates(t, s, map[string]int{"p/short/done": total * 3 / 4, "p/long/done": total / 4})
	rows, ok := rowsOf(t, s)
	if ok && len(rows) != total {
		t.Errorf("Finished = %d rows, want %d", len(rows), total)
	}
	for _, r := range rows {
		if diff := cmp.Diff(result(r.ID), r.Result); diff != "" {
			t.Errorf("%s result (-want +got):\n%s", r.ID, diff)
			break
		}
	}
}

// claimers is the shared record of testConcurrentClaimers' workers.
type claimers struct {
	mu        sync.Mutex
	holder    map[string]string // id -> owner holding it now
	completed map[string]int
	ingested  chan struct{}
}

// work claims batches of lane as owner and completes them until the lane
// is drained after ingest ended, checking no one else holds what it got.
func (c *claimers) work(t *testing.T, s queue, owner, lane string) {
	ctx := context.Background()
	const batch = 16
	for {
		cs, err := s.Claim(ctx, lane, batch, owner, time.Hour)
		if err != nil {
			t.Errorf("%s: Claim: %v", owner, err)
			return
		}
		if len(cs) == 0 {
			select {
			case <-c.ingested:
				// Everything is in; a last empty claim means the lane is drained.
				if cs, err = s.Claim(ctx, lane, batch, owner, time.Hour); err != nil || len(cs) == 0 {
					return
				}
			default:
				time.Sleep(time.Millisecond)
				continue
			}
		}
		c.mu.Lock()
		for _, cl := range cs {
			if h, ok := c.holder[cl.ID]; ok {
				t.Errorf("%s claimed %s while %s holds it", owner, cl.ID, h)
			}
			c.holder[cl.ID] = owner
		}
		c.mu.Unlock()
		for _, cl := range cs {
			err := s.Complete(ctx, cl.ID, owner, result(cl.ID))
			c.mu.Lock()
			delete(c.holder, cl.ID)
			if err == nil {
				c.completed[cl.ID]++
			}
			c.mu.Unlock()
			if err != nil {
				t.Errorf("%s: Complete %s: %v", owner, cl.ID, err)
			}
		}
	}
}
