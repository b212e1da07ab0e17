package monitor

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

func f(v float64) *float64 { return &v }

// TestFoldHistory: workers' counters add up, the server's gauges take the
// largest reading, a minute nobody wrote is zero throughput and an unknown
// gauge, and the current minute is a rate over its elapsed part.
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
	h := FoldHistory(rows, t0, t0.Add(2*time.Minute), t0.Add(2*time.Minute+30*time.Second))
	want := History{
		Times:          []int64{t0.Unix(), t0.Add(time.Minute).Unix(), t0.Add(2 * time.Minute).Unix()},
		TokensPerSec:   []float64{30, 0, 10},
		RequestsPerSec: []float64{2, 0, 0.5},
		SamplesPerSec:  []float64{1, 0, 0.2},
		ErrorsPerMin:   []float64{2, 0, 1},
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
