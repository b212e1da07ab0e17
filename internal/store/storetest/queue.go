package storetest

import (
	"context"
	"io"
	"testing"

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
