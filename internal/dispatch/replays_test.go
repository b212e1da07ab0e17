package dispatch

import (
	"sync/atomic"
	"testing"
	"time"
)

// replayChatter is a fake endpoint whose client reports keep-alive replays,
// as llm.Client does.
type replayChatter struct {
	*fakeChatter
	n atomic.Int64
}

func (r *replayChatter) Replays() int64 { return r.n.Load() }

// TestSnapshotReplays (issue 30 item 8): an endpoint's keep-alive replays,
// counted by its client, are in the snapshot the views read.
func TestSnapshotReplays(t *testing.T) {
	st := newFakeStore()
	st.add("short", "s", 2)
	eps, fakes := fleet(newTracker(), ok(time.Millisecond), "http://a")
	rc := &replayChatter{fakeChatter: fakes["http://a"]}
	rc.n.Store(3)
	eps[0].Client = rc
	d := mustNew(t, baseConfig(st, eps))
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := d.Snapshot().Endpoints[0].Replays; got != 3 {
		t.Errorf("snapshot replays = %d, want the client's 3", got)
	}
}
