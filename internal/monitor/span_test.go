package monitor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// hbOf is a heartbeat of run owner (pid) from started to last with the
// counters of a runner that streamed tokens and finished done samples.
func hbOf(owner string, pid int, started, last time.Time, tokens, done int64, exited bool) store.Heartbeat {
	b, _ := json.Marshal(Beat{State: Running, Tokens: tokens, Done: done, Exited: exited})
	return store.Heartbeat{Owner: owner, PID: pid, Host: "h", Started: started, Time: last, Counters: b}
}

// TestSpanOf: the rates and charts are over the newest run and the workers
// beating beside it; when none of them did any work (a no-op re-run, a run
// still waiting for its server), over the newest run that did, said so.
func TestSpanOf(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 43, 4, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		name string
		hbs  []store.Heartbeat // newest first
		want RunSpan
	}{
		{"one working run",
			[]store.Heartbeat{hbOf("a", 1, at(0), at(22), 600000, 600, true)},
			RunSpan{Started: at(0), Ended: at(22), PIDs: []int{1}, Owners: []string{"a"}}},
		{"a no-op re-run shows the run before it",
			[]store.Heartbeat{hbOf("b", 2, at(26), at(26.3), 0, 0, true), hbOf("a", 1, at(0), at(22), 600000, 600, true)},
			RunSpan{Started: at(0), Ended: at(22), PIDs: []int{1}, Owners: []string{"a"}, Earlier: true, IdlePID: 2}},
		{"a run that streamed tokens but finished nothing yet is its own",
			[]store.Heartbeat{hbOf("b", 2, at(26), at(29), 3000, 0, false), hbOf("a", 1, at(0), at(22), 600000, 600, true)},
			RunSpan{Started: at(26), Ended: at(29), PIDs: []int{2}, Owners: []string{"b"}}},
		{"two workers side by side: the older one's work counts",
			[]store.Heartbeat{hbOf("b", 2, at(100), at(200), 0, 0, false), hbOf("a", 1, at(0), at(199), 9000, 9, false)},
			RunSpan{Started: at(0), Ended: at(200), PIDs: []int{2, 1}, Owners: []string{"b", "a"}}},
		{"no run ever worked: the newest",
			[]store.Heartbeat{hbOf("b", 2, at(26), at(27), 0, 0, true), hbOf("a", 1, at(0), at(22), 0, 0, true)},
			RunSpan{Started: at(26), Ended: at(27), PIDs: []int{2}, Owners: []string{"b"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := SpanOf(c.hbs)
			if !ok {
				t.Fatal("no span")
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("SpanOf (-want +got):\n%s", diff)
			}
		})
	}
	if _, ok := SpanOf(nil); ok {
		t.Error("a span without heartbeats")
	}
}

// TestNowRateOwnRunsOnly: 3 s into a run, the minute before it (another
// run's rows) is not counted: the rate is the young run's 3,000 tokens
// over its 3 s, not 30,000 more credited to it.
func TestNowRateOwnRunsOnly(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	started := t0.Add(50 * time.Second)
	now := started.Add(3 * time.Second)
	rows := []store.Minute{
		{Time: t0.Add(30 * time.Second), Worker: "old", Tokens: 20000, Samples: 20},
		{Time: t0.Add(50 * time.Second), Worker: "old", Tokens: 10000, Samples: 10},
		{Time: t0.Add(50 * time.Second), Worker: "new", Tokens: 3000, Samples: 3},
		{Time: t0.Add(50 * time.Second), Worker: "new", Endpoint: "http://e", Tokens: 3000},
	}
	r := NowRate(rows, now, RunSpan{Started: started, Ended: now, Owners: []string{"new"}})
	if r.Tokens != 3000 || r.Samples != 3 || r.Window != 3*time.Second || r.TokensPerSec != 1000 {
		t.Errorf("NowRate = %d tokens, %d samples over %s (%.1f tok/s); want 3000, 3 over 3s (1000 tok/s)", r.Tokens, r.Samples, r.Window, r.TokensPerSec)
	}
}

// TestAssessNoOpRerun: after a re-run that redid nothing (0.3 s, nothing
// sent), the report's rates are the working run's, over its 22 s, and
// rates_run names that run and the idle one; no ETA comes from them.
func TestAssessNoOpRerun(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now().Add(-time.Minute).Truncate(5 * time.Second)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var rows []store.Minute
	for i := range 4 { // 22 s of 5 s rows, 1,100 tokens a second
		rows = append(rows, store.Minute{Time: at(float64(5 * i)), Worker: "a", Tokens: 5500, Samples: 5, KVUsage: -1, Queued: -1, Running: -1})
	}
	rows = append(rows, store.Minute{Time: at(20), Worker: "a", Tokens: 2200, Samples: 2, KVUsage: -1, Queued: -1, Running: -1})
	if err := st.PutMinutes(ctx, rows); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	first := hbOf("a", 11, at(0), at(22), 24200, 22, true)
	rerun := hbOf("b", 12, at(26), at(26.3), 0, 0, true)
	first.Host, rerun.Host = host, host
	for _, hb := range []store.Heartbeat{first, rerun} {
		if err := st.PutHeartbeat(ctx, hb); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Assess(ctx, st, AssessOptions{Job: "j", Now: at(27), DeadAfter: time.Minute, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	if r.RatesRun == nil || !r.RatesRun.Earlier || r.RatesRun.IdlePID != 12 || !cmp.Equal(r.RatesRun.PIDs, []int{11}) {
		t.Fatalf("rates_run = %+v; want the earlier run pid 11, idle pid 12", r.RatesRun)
	}
	if r.Rate1m.Window != 22*time.Second || r.Rate1m.Tokens != 24200 || r.Rate1m.TokensPerSec != 1100 {
		t.Errorf("rate_1m = %d tokens over %s (%.1f tok/s); want 24200 over 22s (1100 tok/s)", r.Rate1m.Tokens, r.Rate1m.Window, r.Rate1m.TokensPerSec)
	}
	if r.Rate10m.Window != 22*time.Second {
		t.Errorf("rate_10m window = %s; want the working run's 22s", r.Rate10m.Window)
	}
	// The chart's axis is over the same run: its buckets hold the tokens.
	h, err := ReadHistory(ctx, st, JobAxis(*r.RatesRun, true, at(27), 0), at(27))
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, v := range h.TokensPerSec {
		sum += v * h.BucketSeconds
	}
	if sum < 24000 {
		t.Errorf("the chart holds %.0f tokens over %d buckets from %s; want the working run's 24200", sum, len(h.Times), time.Unix(h.Times[0], 0))
	}
}
