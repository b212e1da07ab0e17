package storetest

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// QueueStore is what the queue part of the suite drives: a store.Queue,
// and Ingest to put samples in it.
type QueueStore interface {
	store.Queue
	Ingest(ctx context.Context, samples []store.NewSample) (int, error)
}

// queue is a QueueStore with the token-less shorthands the tests write
// outcomes with (each one Commit).
type queue struct {
	QueueStore
	store.Shorthands
}

func asQueue(s QueueStore) queue { return queue{s, store.Shorthands{Committer: s}} }

// queueTests are the cases a store.Queue alone must pass: claims, leases
// and the transitions' effect on states, attempts and the claim order. A
// case that can also read the stored rows (store.Dataset) checks them.
var queueTests = []struct {
	name string
	fn   func(t *testing.T, s queue)
}{
	{"IngestIdempotent", testIngestIdempotent},
	{"ClaimLaneLimitOrder", testClaimLaneLimitOrder},
	{"ClaimNotBefore", testClaimNotBefore},
	{"DeferKeepsAttempts", testDefer},
	{"ExtendLeases", testExtendLeases},
	{"ReleaseKeepsAttempts", testRelease},
	{"EscalateKeepsAttempts", testEscalate},
	{"ExpireLeasesExpiredOnly", testExpireLeases},
	{"Counts", testCounts},
	{"ReleaseOwnerExcept", testReleaseOwnerExcept},
	{"ConcurrentClaimers", testConcurrentClaimers},
	{"ConcurrentCompletions", testConcurrentCompletions},
	// Keeping a conversation on the server that holds its prefix.
	{"ClaimLaterTurnsFirst", testClaimLaterTurnsFirst},
	{"PriorKeepsEachTurnsEndpoint", testPriorEndpoints},
	{"ClaimKeptLeavesOutWhatTheCallerHolds", testClaimKept},
}

// RunQueue runs the queue part of the suite (Run runs it too); open must
// return a fresh, empty queue for each subtest, which the suite closes
// when it is an io.Closer.
func RunQueue(t *testing.T, open func(t *testing.T) QueueStore) {
	for _, tc := range queueTests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			if c, ok := s.(io.Closer); ok {
				t.Cleanup(func() {
					if err := c.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				})
			}
			tc.fn(t, asQueue(s))
		})
	}
}

// rowsOf returns the finished rows when s can read them (ok=false: it
// is a queue alone, whose rows the case cannot check).
func rowsOf(t *testing.T, s queue) (rows []store.Row, ok bool) {
	t.Helper()
	d, ok := s.QueueStore.(store.Dataset)
	if !ok {
		return nil, false
	}
	return finished(t, d), true
}

// testDefer: OpDefer returns a sample to pending after NotBefore without
// spending an attempt, fenced by its token like every transition.
func testDefer(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b"))
	got := claim(t, s, "short", 2, "w")
	must(t, s.Retry(ctx, "b", "w", time.Now().Add(-time.Second), "HTTP 500"))
	tokenOf := map[string]int64{}
	for _, c := range got {
		tokenOf[c.ID] = c.Token
	}
	stale := store.Transition{Op: store.OpDefer, ID: "a", Owner: "w", Token: tokenOf["a"] + 1000, NotBefore: time.Now().Add(time.Hour)}
	if tokenOf["a"] != 0 {
		wantNotLeased(t, "Defer under another token", s.Commit(ctx, stale))
	}
	must(t, s.Commit(ctx, store.Transition{Op: store.OpDefer, ID: "a", Owner: "w", Token: tokenOf["a"], NotBefore: time.Now().Add(time.Hour), LastError: "HTTP 500: boom"}))
	wantStates(t, s, map[string]int{"p/short/pending": 2})
	again := claim(t, s, "short", 10, "w2")
	if diff := cmp.Diff([]string{"b"}, ids(again)); diff != "" {
		t.Errorf("Claim after a deferral (-want +got): a waits an hour\n%s", diff)
	}
	must(t, s.Commit(ctx, store.Transition{Op: store.OpDefer, ID: "b", Owner: "w2", Token: again[0].Token, NotBefore: time.Now().Add(-time.Second)}))
	c := claim(t, s, "short", 10, "w3")
	if len(c) != 1 || c[0].ID != "b" || c[0].Attempts != 1 {
		t.Errorf("claimed %+v after deferring b, want b with its 1 attempt (the retry), none for the deferral", c)
	}
}
