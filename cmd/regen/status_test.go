package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
	"github.com/regen-dev/regen/internal/web"
)

// statusFixture is a job store written with a controlled clock, so its
// status report is the same on every run.
type statusFixture struct {
	spec  *job.Spec
	st    *sqlite.Store
	clock time.Time
	rows  map[time.Time]*store.Minute // the runner's history, by slot
}

var statusT0 = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

func newStatusFixture(t *testing.T) *statusFixture {
	t.Helper()
	// Text views print clock times in the local zone.
	local := time.Local
	time.Local = time.UTC
	t.Cleanup(func() { time.Local = local })
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	src := "name: golden\nsources: [{partition: B1, path: p.jsonl, prompt: q}]\nendpoints: [{url: \"http://10.0.0.7:30000\"}]\n"
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &statusFixture{spec: spec, clock: statusT0, rows: map[time.Time]*store.Minute{}}
	p, _ := spec.Store.SQLitePath()
	if f.st, err = sqlite.OpenWith(p, sqlite.Options{Now: func() time.Time { return f.clock }}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.st.Close() })
	return f
}

// work ingests n samples and finishes done of them, one every step, each
// with 500 completion tokens.
func (f *statusFixture) work(t *testing.T, n, done int, step time.Duration) {
	t.Helper()
	ctx := context.Background()
	var samples []store.NewSample
	for i := range n {
		samples = append(samples, store.NewSample{ID: fmt.Sprintf("B1/row-%03d", i), Partition: "B1", Lane: "default",
			Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`), Origin: fmt.Sprintf("p.jsonl:%d", i+1)})
	}
	if _, err := f.st.Ingest(ctx, samples); err != nil {
		t.Fatal(err)
	}
	claimed, err := f.st.Claim(ctx, "default", done, "w", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		f.clock = f.clock.Add(step)
		if err := f.st.Complete(ctx, c.ID, "w", store.Result{Response: []byte(`{}`), FinishReason: "stop", PromptTokens: 20, CompletionTokens: 500}); err != nil {
			t.Fatal(err)
		}
		f.finished(t, 500)
	}
}

// finished writes into the history what a runner would for a sample
// finished now with tokens completion tokens.
func (f *statusFixture) finished(t *testing.T, tokens int64) {
	t.Helper()
	slot, _ := stats.SlotAt(f.clock, statusT0)
	m := f.rows[slot]
	if m == nil {
		// Written by the runner that beats (statusOwner): a rate counts
		// only its own run's rows.
		m = &store.Minute{Time: slot, Worker: statusOwner, KVUsage: -1, Queued: -1, Running: -1}
		f.rows[slot] = m
	}
	m.Samples++
	m.Tokens += tokens
	if err := f.st.PutMinutes(context.Background(), []store.Minute{*m}); err != nil {
		t.Fatal(err)
	}
}

// statusOwner is the lease owner of the fixture's runner.
const statusOwner = "gpu-node-1-4242-ab"

func (f *statusFixture) beat(t *testing.T, b monitor.Beat) {
	t.Helper()
	counters, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	hb := store.Heartbeat{Owner: statusOwner, PID: 4242, Host: "gpu-node-1", Time: f.clock, Started: statusT0, Counters: counters}
	if err := f.st.PutHeartbeat(context.Background(), hb); err != nil {
		t.Fatal(err)
	}
}

func (f *statusFixture) event(t *testing.T, at time.Time, kind, subject, state, evidence string) {
	t.Helper()
	if err := f.st.AddEvent(context.Background(), store.Event{Time: at, Kind: kind, Subject: subject, State: state, Evidence: evidence}); err != nil {
		t.Fatal(err)
	}
}

// report runs what `regen status` runs at now, as text and as JSON.
func (f *statusFixture) report(t *testing.T, now time.Time) (text, js string, code int) {
	t.Helper()
	var out bytes.Buffer
	code = exitCodeOf(t, writeStatus(context.Background(), &out, f.spec, f.st, now, "status-host", false))
	text = out.String()
	out.Reset()
	if c := exitCodeOf(t, writeStatus(context.Background(), &out, f.spec, f.st, now, "status-host", true)); c != code {
		t.Errorf("text exits %d, JSON exits %d", code, c)
	}
	return text, out.String(), code
}

func exitCodeOf(t *testing.T, err error) int {
	t.Helper()
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	t.Fatalf("status: %v", err)
	return -1
}

// TestStatusGoldenDown: a live runner whose only endpoint went down. The
// endpoint says DOWN since the moment it went down, there is no ETA while
// nothing can progress, and unknown times are null in the JSON.
func TestStatusGoldenDown(t *testing.T) {
	f := newStatusFixture(t)
	f.work(t, 10, 4, 5*time.Second)
	ctx := context.Background()
	claimed, err := f.st.Claim(ctx, "default", 2, "w", time.Hour)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if err := f.st.Retry(ctx, claimed[0].ID, "w", f.clock, "HTTP 503: overloaded"); err != nil {
		t.Fatal(err)
	}
	r := store.Result{Response: []byte(`{"content":"<think>x"}`), FinishReason: "stop", PromptTokens: 10, CompletionTokens: 4}
	if err := f.st.Reject(ctx, claimed[1].ID, "w", r, "think_tags", "content holds <think> at byte 0"); err != nil {
		t.Fatal(err)
	}
	f.finished(t, 4)
	if err := f.st.AddIngestErrors(ctx, []store.IngestError{{Partition: "B1", Origin: "p.jsonl:11", Field: "q", Reason: "field q: missing"}}); err != nil {
		t.Fatal(err)
	}
	url := "http://10.0.0.7:30000"
	ready := statusT0.Add(time.Second)
	down := statusT0.Add(21 * time.Second)
	f.event(t, statusT0, "ingest", "job", "", "11 rows read: 10 new samples, 0 already stored, 1 bad")
	f.event(t, ready, "endpoint_state", url, "READY", "")
	f.event(t, down, "endpoint_state", url, "DOWN", "requests fail: connection refused")
	f.event(t, down, "job_state", "job", "DOWN", url+" DOWN (requests fail: connection refused)")
	f.clock = statusT0.Add(30 * time.Second)
	f.beat(t, monitor.Beat{State: monitor.Down, Evidence: []string{url + " DOWN (requests fail: connection refused)"}, Tokens: 2000,
		LastTokenAt: statusT0.Add(20 * time.Second),
		Endpoints: []monitor.EndpointStatus{{URL: url, State: monitor.Down, Since: down, Cause: "requests fail: connection refused",
			LastTokenAt: statusT0.Add(20 * time.Second), Tokens: 2000}}})

	text, js, code := f.report(t, statusT0.Add(31*time.Second))
	if code != 1 {
		t.Errorf("exit code %d, want 1 (DOWN)", code)
	}
	golden(t, "status/down.txt", text)
	golden(t, "status/down.json", js)
	if api := dashboardStatus(t, f, statusT0.Add(31*time.Second)); api != js {
		t.Errorf("the dashboard's /api/status differs from status --json:\n%s\nwant:\n%s", api, js)
	}
}

// dashboardStatus is the body of the dashboard's /api/status as of now.
func dashboardStatus(t *testing.T, f *statusFixture, now time.Time) string {
	t.Helper()
	srv, err := web.New(web.Options{Store: f.st, Report: func(ctx context.Context) (monitor.Report, error) {
		return assess(ctx, f.spec, f.st, now, "status-host")
	}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/api/status", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /api/status: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// TestStatusGoldenDone: a finished job whose runner exited long ago shows
// DONE with the job's average throughput, not a rate decayed to zero.
func TestStatusGoldenDone(t *testing.T) {
	f := newStatusFixture(t)
	f.work(t, 6, 6, 2*time.Second)
	f.event(t, statusT0, "ingest", "job", "", "6 rows read: 6 new samples, 0 already stored, 0 bad")
	f.event(t, f.clock, "job_state", "job", "DONE", "")
	f.beat(t, monitor.Beat{State: monitor.Done, Exited: true, ExitReason: monitor.ExitFinished})

	text, js, code := f.report(t, f.clock.Add(3*time.Hour))
	if code != 0 {
		t.Errorf("exit code %d, want 0 (DONE)", code)
	}
	golden(t, "status/done.txt", text)
	golden(t, "status/done.json", js)

	// The document reads back into the report type.
	var r monitor.Report
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatal(err)
	}
	if r.State != monitor.Done || r.Average == nil || r.Average.Samples != 6 {
		t.Errorf("decoded report: state %s, average %+v; want DONE over 6 samples", r.State, r.Average)
	}
}

// TestStatusJSONDocumented: every key the status document has is named in
// docs/status-json.md, so a field added to the report without its
// documentation fails here.
func TestStatusJSONDocumented(t *testing.T) {
	docs, err := os.ReadFile("../../docs/status-json.md")
	if err != nil {
		t.Fatal(err)
	}
	// Besides the golden documents, one with every optional part filled:
	// an endpoint's load is there only while the runner scrapes it.
	full, err := json.Marshal(monitor.Report{Heartbeat: &monitor.HeartbeatInfo{}, Average: &monitor.Rate{},
		Cells:      []monitor.CellCounts{{Partition: "p", Lane: "l"}},
		Endpoints:  []monitor.EndpointStatus{{URL: "http://x", Load: &monitor.Load{At: statusT0, KVUsage: ptr(0.5), Queued: ptr(1.0), Running: ptr(2.0)}}},
		Events:     []monitor.Event{{Kind: "ingest"}},
		LastErrors: []monitor.ErrorLine{{ID: "p/1"}},
		Rejects:    []monitor.RuleCount{{Rule: "empty", N: 1}},
		Capture:    &monitor.CaptureProgress{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"status/down.json", "status/done.json", "full"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if name == "full" {
			b, err = full, nil
		}
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var walk func(any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, x := range v {
					if !bytes.Contains(docs, []byte("`"+k+"`")) && !bytes.Contains(docs, []byte("."+k+"`")) {
						t.Errorf("%s: key %q is not documented in docs/status-json.md", name, k)
					}
					walk(x)
				}
			case []any:
				for _, x := range v {
					walk(x)
				}
			}
		}
		walk(doc)
	}
}

func ptr(v float64) *float64 { return &v }

// TestStatusManyRestarts: a single-runner SQLite job started 40 times (39
// runs interrupted, the last one killed) has one runner and a history, not
// "workers: 0 live of 40" and dead-worker blocks.
func TestStatusManyRestarts(t *testing.T) {
	f := newStatusFixture(t)
	f.work(t, 10, 4, time.Second)
	ctx := context.Background()
	for i := range 40 {
		b := monitor.Beat{State: monitor.Running, Exited: i < 39, ExitReason: "interrupted"}
		counters, _ := json.Marshal(b)
		f.clock = f.clock.Add(time.Minute)
		hb := store.Heartbeat{Owner: fmt.Sprintf("gpu-node-1-%d-ab", 5000+i), PID: 5000 + i, Host: "gpu-node-1",
			Time: f.clock, Started: f.clock.Add(-50 * time.Second), Counters: counters}
		if err := f.st.PutHeartbeat(ctx, hb); err != nil {
			t.Fatal(err)
		}
	}
	text, _, code := f.report(t, f.clock.Add(10*time.Minute))
	if code != 2 {
		t.Errorf("exit %d, want 2 (the last runner is dead)", code)
	}
	if strings.Contains(text, "workers:") || strings.Contains(text, "pid 5038") {
		t.Errorf("ended runs listed as workers:\n%s", text)
	}
	if !strings.Contains(text, "runner: pid 5039 on gpu-node-1") || !strings.Contains(text, "earlier runs: 39 (39 stopped), the last ended 09:39:04") {
		t.Errorf("want the runner line and one history line:\n%s", text)
	}
}

// TestStatusDeadRunnerAsOfDeath: a runner killed with 45 requests in flight
// on a READY server at 21% KV. Two minutes later status shows the endpoint
// as of its death (not READY now), the leases as not in flight, rates up
// to the death, and /metrics serves no server gauges of the dead runner.
func TestStatusDeadRunnerAsOfDeath(t *testing.T) {
	f := newStatusFixture(t)
	f.work(t, 100, 40, 500*time.Millisecond) // 40 answers in the 20 s before the death
	ctx := context.Background()
	if _, err := f.st.Claim(ctx, "default", 45, "w", time.Hour); err != nil {
		t.Fatal(err)
	}
	url := "http://10.0.0.7:30000"
	f.beat(t, monitor.Beat{State: monitor.Running, InFlight: 45, Tokens: 20000, Endpoints: []monitor.EndpointStatus{{
		URL: url, State: monitor.Ready, Since: statusT0, InFlight: 45, Limit: 182,
		Load: &monitor.Load{At: f.clock, KVUsage: ptr(0.21), Running: ptr(11), Queued: ptr(0)}}}})
	died := f.clock
	now := died.Add(2 * time.Minute)

	text, _, code := f.report(t, now)
	if code != 2 {
		t.Errorf("exit %d, want 2 (DEAD)", code)
	}
	for _, want := range []string{
		"endpoints when the runner died (its last heartbeat, 09:00:20; nothing is sent to them now):",
		url + " READY since 09:00:00, in flight 45 when it died",
		"(45): leased by the runner that died at 09:00:20, not in flight",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	r, err := assess(ctx, f.spec, f.st, now, "status-host")
	if err != nil {
		t.Fatal(err)
	}
	if !r.RunnerDied || r.Rate1m.Samples != 40 || r.Rate1m.Window != 20*time.Second {
		t.Errorf("runner_died %v, rate_1m %d samples over %s; want true, 40 over 20s (up to the death, not the last minute of now)",
			r.RunnerDied, r.Rate1m.Samples, r.Rate1m.Window)
	}

	m := monitor.NewMetrics(func(ctx context.Context) (monitor.Report, error) {
		return assess(ctx, f.spec, f.st, now, "status-host")
	})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range fams {
		for _, s := range fam.GetMetric() {
			if strings.HasPrefix(fam.GetName(), "regen_endpoint_") {
				got[fam.GetName()] += s.GetGauge().GetValue() + 1 // +1: present, even at 0
			}
		}
	}
	want := map[string]float64{"regen_endpoint_in_flight": 1} // present, 0: nobody sends now
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("endpoint gauges of a dead runner (value+1 per series; -want +got):\n%s", diff)
	}
}
