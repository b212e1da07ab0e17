package dispatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/engine"
)

// After a crash under pressure two auto lanes share a ceiling of 30: each
// lane's own limit may still read 30, but the endpoint's AutoLimit is what
// can run there, 30 and not their sum (status showed 60 before b40daa4).
// Endpoint reports exactly what Snapshot does for that endpoint.
func TestEndpointAutoLimitHeldToTheSharedCeiling(t *testing.T) {
	d := oneEndpoint(t, LaneConfig{Name: "short", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 1000}, LaneConfig{Name: "long", Auto: &limit.Bounds{Min: 1, Initial: 4}, MaxTokens: 10000})
	now := time.Unix(1000, 0)
	e := d.epByURL["http://a"]
	before, ok := d.Endpoint("http://a")
	if !ok || before.AutoLimit != 8 {
		t.Fatalf("before a crash: AutoLimit %d (found %v), want 8 (4 + 4)", before.AutoLimit, ok)
	}
	calls := underPressure(d, e, &now)
	if got := d.NoteCrash("http://a", engine.CauseCUDAOOM, now); len(got) != 2 {
		t.Fatalf("crash with 40 in flight: %v, want a ceiling decision per lane", got)
	}
	releaseCalls(d, calls)
	got, _ := d.Endpoint("http://a")
	sum := 0
	for _, l := range got.Lanes {
		sum += l.Limit
	}
	if got.AutoLimit != 30 || sum <= 30 {
		t.Errorf("after the crash: AutoLimit %d with lane limits summing to %d; want 30, held below the sum", got.AutoLimit, sum)
	}
	snap := d.Snapshot()
	if diff := cmp.Diff(snap.Endpoints[0], got); diff != "" {
		t.Errorf("Endpoint differs from Snapshot's entry (-snapshot +endpoint):\n%s", diff)
	}
	if _, ok := d.Endpoint("http://nowhere"); ok {
		t.Errorf("Endpoint of a URL the dispatcher does not know: found, want not")
	}
	if tot := d.Totals(); tot.InFlight != 0 {
		t.Errorf("Totals after every call was released: %d in flight, want 0", tot.InFlight)
	}
}
