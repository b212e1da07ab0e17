package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestNowAgrees: the dashboard's tile (/api/status rate_1m), the last
// bucket of its one-minute throughput chart (/api/history) and /metrics'
// regen_tokens_per_second are one number on the same stored history, and
// it is the tokens of the last minute of rows over the seconds they span.
// Two workers' rows add up; rows before the minute do not count.
func TestNowAgrees(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "now.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// 40 minutes into a run, 2.5 s into a five-second slot.
	now := time.Date(2026, 12, 4, 6, 40, 2, 500_000_000, time.UTC)
	started := now.Add(-40 * time.Minute)
	beat, _ := json.Marshal(monitor.Beat{State: monitor.Running})
	// Both workers beat: a rate counts the rows of the runs it is over.
	must(t, st.PutHeartbeat(ctx, store.Heartbeat{Owner: "w2", PID: 2, Host: "h", Time: now.Add(-time.Second), Started: started, Counters: beat}))
	must(t, st.PutHeartbeat(ctx, store.Heartbeat{Owner: "w1", PID: 1, Host: "h", Time: now, Started: started, Counters: beat}))
	var rows []store.Minute
	var lastMinute int64
	slotEnd := now.Truncate(5 * time.Second).Add(5 * time.Second)
	for at := started.Truncate(5 * time.Second); at.Before(now); at = at.Add(5 * time.Second) {
		tokens := int64(at.Sub(started)/time.Second) % 700 // a changing rate
		for _, w := range []string{"w1", "w2"} {
			rows = append(rows, store.Minute{Time: at, Worker: w, Tokens: tokens, Samples: 1, KVUsage: -1, Queued: -1, Running: -1},
				store.Minute{Time: at, Worker: w, Endpoint: "http://e", Tokens: tokens, KVUsage: 0.5, Queued: 0, Running: 3})
			if !at.Before(slotEnd.Add(-time.Minute)) {
				lastMinute += tokens
			}
		}
	}
	must(t, st.PutMinutes(ctx, rows))
	report := func(ctx context.Context) (monitor.Report, error) {
		return monitor.Assess(ctx, st, monitor.AssessOptions{Job: "now", Now: now, DeadAfter: time.Hour})
	}
	s, err := New(Options{Store: st, Report: report, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	var status struct {
		Rate struct {
			TokensPerSec float64 `json:"tokens_per_sec"`
		} `json:"rate_1m"`
	}
	var hist monitor.History
	for path, v := range map[string]any{"/api/status": &status, "/api/history": &hist} {
		code, body := get(t, nil, request(t, "GET", srv.URL+path))
		if code != http.StatusOK || json.Unmarshal([]byte(body), v) != nil {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
	}
	code, body := get(t, nil, request(t, "GET", srv.URL+"/metrics"))
	var metric float64 = -1
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if code != http.StatusOK || err != nil {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	if f := fams["regen_tokens_per_second"]; f != nil && len(f.Metric) == 1 {
		metric = f.Metric[0].GetGauge().GetValue()
	}

	// The minute ending with the current slot has 57.5 s behind it.
	want := float64(lastMinute) / now.Sub(slotEnd.Add(-time.Minute)).Seconds()
	n := len(hist.TokensPerSec)
	if hist.BucketSeconds != 60 || n == 0 || n > 60 || hist.Times[0] > started.Unix() {
		t.Fatalf("history: %d buckets of %v s from %d; want minutes from the run's start %d", n, hist.BucketSeconds, hist.Times[0], started.Unix())
	}
	tile, chart := status.Rate.TokensPerSec, hist.TokensPerSec[n-1]
	if want <= 0 || !near(tile, want) || !near(chart, want) || !near(metric, want) {
		t.Errorf("now: tile %v, chart's last bucket %v, metric %v; want all %v", tile, chart, metric, want)
	}
}

func near(a, b float64) bool { d := a - b; return d < 1e-6 && d > -1e-6 }
