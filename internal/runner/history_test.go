package runner

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/store"
)

// TestHistoryRowsPerMinute: in a run older than an hour each minute's
// rows hold what happened within it; the current minute is rewritten as
// it grows. Tokens are those streamed (dispatch StreamedTokens: counted as
// they arrive, each answer topped up to its usage), neither raw chunks nor
// only the finished answers' usage.
func TestHistoryRowsPerMinute(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	h := &history{worker: "w", started: t0.Add(-2 * time.Hour)}
	snap := func(done, tokens, requests int64, errs map[string]int64, inFlight int) dispatch.Snapshot {
		// Rejects finish samples too; answers that led to a next turn do not.
		return dispatch.Snapshot{Counters: dispatch.Counters{Done: done, DeadLettered: 1, Rejected: done / 2, Turns: 3 * done},
			Endpoints: []dispatch.EndpointStats{{URL: "http://a", TokensTotal: 7 * tokens, CompletionTokens: tokens / 2, StreamedTokens: tokens, Requests: requests, Errors: errs, InFlight: inFlight}}}
	}
	load := func(string) (float64, float64, float64) { return 0.5, 2, 8 }
	row := func(min int, endpoint string, samples int, tokens, requests, errs int64, inFlight int) store.Minute {
		m := store.Minute{Time: t0.Add(time.Duration(min) * time.Minute), Worker: "w", Endpoint: endpoint, Samples: samples,
			Tokens: tokens, Requests: requests, Errors: errs, InFlight: inFlight, KVUsage: 0.5, Queued: 2, Running: 8}
		if endpoint == "" {
			m.KVUsage, m.Queued, m.Running = -1, -1, -1
		}
		return m
	}
	steps := []struct {
		at   time.Duration
		snap dispatch.Snapshot
		want []store.Minute
	}{
		// The run starts with counters already at zero: the first minute starts there.
		{10 * time.Second, snap(0, 0, 0, nil, 3), []store.Minute{row(0, "", 0, 0, 0, 0, 3), row(0, "http://a", 0, 0, 0, 0, 3)}},
		{40 * time.Second, snap(4, 100, 5, map[string]int64{"retryable": 1}, 2),
			[]store.Minute{row(0, "", 6, 100, 5, 1, 2), row(0, "http://a", 0, 100, 5, 1, 2)}},
		// A new minute: what was counted since the last write (at 40 s) is
		// shared by time, 20 s of its 30 s to the minute that closed, which
		// is written again first (with its last gauges), a third to the new.
		{70 * time.Second, snap(6, 130, 8, map[string]int64{"retryable": 1, "server-down": 2}, 1),
			[]store.Minute{row(0, "", 8, 120, 7, 2, 2), row(0, "http://a", 0, 120, 7, 2, 2),
				row(1, "", 1, 10, 1, 1, 1), row(1, "http://a", 0, 10, 1, 1, 1)}},
		{110 * time.Second, snap(9, 200, 12, map[string]int64{"retryable": 1, "server-down": 2}, 0),
			[]store.Minute{row(1, "", 5, 80, 5, 1, 0), row(1, "http://a", 0, 80, 5, 1, 0)}},
	}
	for _, s := range steps {
		got := h.rows(t0.Add(s.at), s.snap, load)
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("rows at +%s (-want +got):\n%s", s.at, diff)
		}
	}
}

// TestHistoryRowsFineSlots: in a run's first hour rows are five-second
// slots, so a job a minute old is charted second by second; the switch
// to minutes comes on a minute boundary. Counts made across a boundary are
// shared by time between the two slots.
func TestHistoryRowsFineSlots(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	h := &history{worker: "w", started: t0}
	snap := func(tokens int64) dispatch.Snapshot {
		return dispatch.Snapshot{Endpoints: []dispatch.EndpointStats{{URL: "http://a", StreamedTokens: tokens}}}
	}
	load := func(string) (float64, float64, float64) { return -1, -1, -1 }
	for _, s := range []struct {
		at     time.Duration
		tokens int64
		slot   time.Duration // the rows' start, from t0
		want   int64         // their tokens
	}{
		{time.Second, 0, 0, 0},
		{3 * time.Second, 50, 0, 50},
		// 30 tokens from +3s to +6s: 20 before the slot's end at +5s.
		{6 * time.Second, 80, 5 * time.Second, 10},
		{time.Hour - time.Second, 100, time.Hour - 5*time.Second, 0},
		{time.Hour + 2*time.Second, 130, time.Hour, 20},
		{time.Hour + 7*time.Second, 140, time.Hour, 30},
	} {
		got := h.rows(t0.Add(s.at), snap(s.tokens), load)
		cur := got[len(got)-2] // the current slot's total, after a closed slot's rows
		if cur.Time != t0.Add(s.slot) || cur.Tokens != s.want {
			t.Errorf("rows at +%s: slot +%s with %d tokens, want +%s with %d", s.at, cur.Time.Sub(t0), cur.Tokens, s.slot, s.want)
		}
	}
	// The closed slot's rows come first: +0s ended with 50 + 20 tokens.
	h = &history{worker: "w", started: t0}
	h.rows(t0.Add(time.Second), snap(0), load)
	h.rows(t0.Add(3*time.Second), snap(50), load)
	if got := h.rows(t0.Add(6*time.Second), snap(80), load); len(got) != 4 || got[0].Time != t0 || got[0].Tokens != 70 {
		t.Errorf("rows at +6s = %+v; want slot +0s again with 70 tokens, then +5s", got)
	}
}
