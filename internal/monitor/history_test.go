package monitor

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/store"
)

func f(v float64) *float64 { return &v }

// TestFoldHistory: workers' counters add up, the server's gauges take the
// largest reading, a minute nobody wrote is zero throughput and an unknown
// gauge, and the current minute is a rate over its elapsed part (errors
// per minute too).
func TestFoldHistory(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	m := func(min int, worker, ep string, tokens, requests int64, samples int, kv float64, limit int) store.Minute {
		return store.Minute{Time: t0.Add(time.Duration(min) * time.Minute), Worker: worker, Endpoint: ep, Tokens: tokens,
			Requests: requests, Samples: samples, Errors: 1, InFlight: 2, KVUsage: kv, Queued: -1, Running: 5, Limit: limit}
	}
	rows := []store.Minute{
		m(-5, "w1", "", 999, 999, 999, -1, 0), // before the window: ignored
		m(0, "w1", "", 600, 60, 30, -1, 0),
		m(0, "w2", "", 1200, 60, 30, -1, 0),
		m(0, "w1", "http://a", 600, 60, 0, 0.5, 8),
		m(0, "w2", "http://a", 1200, 60, 0, 0.7, 8),
		m(2, "w1", "", 300, 15, 6, -1, 0),
		m(2, "w1", "http://a", 300, 15, 0, -1, 0),
	}
	// Now is 30 s into minute 2: its rate is over 30 s.
	a := stats.Axis{Start: t0, End: t0.Add(3 * time.Minute), Bucket: time.Minute, Buckets: 3}
	h := FoldHistory(rows, a, t0.Add(2*time.Minute+30*time.Second))
	want := History{
		Times:          []int64{t0.Unix(), t0.Add(time.Minute).Unix(), t0.Add(2 * time.Minute).Unix()},
		BucketSeconds:  60,
		TokensPerSec:   []float64{30, 0, 10},
		RequestsPerSec: []float64{2, 0, 0.5},
		SamplesPerSec:  []float64{1, 0, 0.2},
		ErrorsPerMin:   []float64{2, 0, 2},
		Endpoints: []EndpointHistory{{
			URL:          "http://a",
			TokensPerSec: []float64{30, 0, 10},
			InFlight:     []*float64{f(4), nil, f(2)},
			KVUsage:      []*float64{f(0.7), nil, nil},
			Queued:       []*float64{nil, nil, nil},
			Running:      []*float64{f(5), nil, f(5)},
			Limit:        []*float64{f(16), nil, nil},
		}},
	}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("FoldHistory (-want +got):\n%s", diff)
	}
}

// TestFoldHistorySlots: five-second rows fold into wider buckets, counts
// summed and gauges the highest reading of the bucket (each reading the
// workers' sum for in-flight), never the sum of several readings.
func TestFoldHistorySlots(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	r := func(sec int, worker, ep string, tokens int64, inFlight int) store.Minute {
		return store.Minute{Time: t0.Add(time.Duration(sec) * time.Second), Worker: worker, Endpoint: ep, Tokens: tokens,
			InFlight: inFlight, KVUsage: float64(sec) / 100, Queued: -1, Running: -1}
	}
	rows := []store.Minute{
		r(0, "w1", "", 100, 0), r(0, "w1", "http://a", 100, 3), r(0, "w2", "http://a", 0, 4),
		r(5, "w1", "", 200, 0), r(5, "w1", "http://a", 200, 5),
		r(10, "w1", "", 50, 0), r(10, "w1", "http://a", 50, 1),
	}
	a := stats.AxisFor(t0, t0.Add(12*time.Second), stats.Slot)
	if a.Bucket != stats.Slot || a.Buckets != 3 {
		t.Fatalf("axis for 12 s = %+v, want three 5 s buckets", a)
	}
	wide := stats.Axis{Start: t0, End: t0.Add(20 * time.Second), Bucket: 10 * time.Second, Buckets: 2}
	h := FoldHistory(rows, wide, t0.Add(12*time.Second))
	want := EndpointHistory{URL: "http://a", TokensPerSec: []float64{30, 25}, InFlight: []*float64{f(7), f(1)},
		KVUsage: []*float64{f(0.05), f(0.1)}, Queued: []*float64{nil, nil}, Running: []*float64{nil, nil}, Limit: []*float64{nil, nil}}
	if diff := cmp.Diff([]float64{30, 25}, h.TokensPerSec); diff != "" {
		t.Errorf("tokens/s (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]EndpointHistory{want}, h.Endpoints); diff != "" {
		t.Errorf("endpoint (-want +got):\n%s", diff)
	}
}
