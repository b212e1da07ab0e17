package fleet

import (
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/monitor"
)

// An endpoint's limit in status is what can run there: the auto lanes'
// limit as dispatch reports it (held to their shared crash ceiling there,
// see dispatch's TestEndpointAutoLimitHeldToTheSharedCeiling), plus each
// fixed lane's own limit; each lane is listed with its own.
func TestLimitsOfAddsFixedLanesToTheAutoLimit(t *testing.T) {
	e := dispatch.EndpointStats{URL: "http://a", AutoLimit: 30, Lanes: []dispatch.EndpointLane{
		{Lane: "short", Auto: true, Limit: 30, Ceiling: 30},
		{Lane: "long", Auto: true, Limit: 12, Ceiling: 30},
		{Lane: "batch", Limit: 8},
	}}
	var st monitor.EndpointStatus
	limitsOf(e, &st, time.Now(), time.Second)
	if st.Limit != 38 || len(st.Lanes) != 3 || st.Lanes[1].Limit != 12 {
		t.Errorf("auto lanes held to 30 and a fixed lane of 8: limit %d, lanes %+v; want 38 and each lane's own", st.Limit, st.Lanes)
	}
	e.AutoLimit = 42
	limitsOf(e, &st, time.Now(), time.Second)
	if st.Limit != 50 {
		t.Errorf("no crash ceiling: limit %d, want 50 (30 + 12 + 8)", st.Limit)
	}
}

// TestLimitsOfCarriesTheHold: the dispatcher's backpressure hold (and the
// client's keep-alive replays) reaches
// the endpoint's status (what status and watch print), and leaves it when
// the dispatcher has none.
func TestLimitsOfCarriesTheHold(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 1, 2, 3, 0, time.UTC)
	e := dispatch.EndpointStats{URL: "http://a", HoldSince: t0, HeldUntil: t0.Add(2 * time.Second), HoldReason: "429 (Retry-After 2s)", FixedCap: 1, Replays: 5}
	var st monitor.EndpointStatus
	limitsOf(e, &st, t0, time.Second)
	want := monitor.Hold{Since: t0, Until: t0.Add(2 * time.Second), Reason: "429 (Retry-After 2s)", FixedCap: 1}
	if st.Hold == nil || *st.Hold != want || st.Replays != 5 {
		t.Errorf("hold %+v, replays %d; want %+v and the client's 5", st.Hold, st.Replays, want)
	}
	limitsOf(dispatch.EndpointStats{URL: "http://a"}, &st, t0, time.Second)
	if st.Hold != nil {
		t.Errorf("hold %+v after it ended, want none", st.Hold)
	}
}
