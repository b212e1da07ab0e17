package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// regenBin is the regen binary built once for the tests that launch the
// simulator as a child process or run `regen run` / `regen status`.
var regenBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "regen-runner-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	regenBin = filepath.Join(dir, "regen")
	build := exec.Command("go", "build", "-o", regenBin, "../../cmd/regen")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build regen:", err)
		return 1
	}
	defer pgtest.Cleanup()
	return m.Run()
}

// jobParams fill a testdata/*.yaml.tmpl job file.
type jobParams struct {
	Name        string
	Regen       string
	Script      string
	Port        int
	Concurrency int
	Hang        string
	RestartMax  int
	Sim         map[string]any
	Alert       []string
}

// fastSim is a simulator that answers a 256-token request in tens of
// milliseconds, on the fast profile's step times the runner's tests were
// written against.
func fastSim(extra map[string]any) map[string]any {
	m := map[string]any{"profile": "fast", "speed": 50, "output_mean": 120, "seed": 7, "load_time": "1s", "warmup_time": "0s"}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// newJob writes n prompts and a job file from tmpl into a fresh directory
// and loads it.
func newJob(t *testing.T, tmpl string, n int, p jobParams) *job.Spec {
	t.Helper()
	dir := t.TempDir()
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), n)
	if p.Name == "" {
		p.Name = "t"
	}
	if p.Regen == "" {
		p.Regen = regenBin
	}
	if p.Concurrency == 0 {
		p.Concurrency = 8
	}
	if p.Hang == "" {
		p.Hang = "2s"
	}
	if p.RestartMax == 0 {
		p.RestartMax = 5
	}
	if p.Sim == nil {
		p.Sim = fastSim(nil)
	}
	if _, set := p.Sim["profile"]; !set {
		p.Sim = maps.Clone(p.Sim)
		p.Sim["profile"] = "fast" // the step times these tests were written against
	}
	tp, err := template.New(tmpl).Funcs(template.FuncMap{"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	}}).ParseFiles(filepath.Join("testdata", tmpl))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := tp.Execute(&b, p); err != nil {
		t.Fatal(err)
	}
	return loadJobYAML(t, dir, b.String())
}

// loadJobYAML writes src as dir/job.yaml and loads it.
func loadJobYAML(t *testing.T, dir, src string) *job.Spec {
	t.Helper()
	path := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(path)
	if err != nil {
		t.Fatalf("load job:\n%s\n%v", src, err)
	}
	return spec
}

func writePrompts(t *testing.T, path string, n int) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id":"s%04d","prompt":"Write a short note about item %d."}`+"\n", i, i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func openStore(t *testing.T, spec *job.Spec) *sqlite.Store {
	t.Helper()
	p, ok := spec.Store.SQLitePath()
	if !ok {
		t.Fatalf("store %s is not sqlite", spec.Store.DSN)
	}
	st, err := sqlite.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// Prepare the read statements the test polls with before the runner
	// holds the store's one connection in transactions: sqlite.Store.stmt
	// prepares under its mutex, and a first prepare while a transaction
	// waits for that mutex deadlocks (reported to the store's owner).
	if _, err := monitor.Assess(context.Background(), st, monitor.AssessOptions{Now: time.Now(), DeadAfter: time.Minute}); err != nil {
		t.Fatalf("warm store: %v", err)
	}
	finishedRows(t, st)
	return st
}

// testLogger sends the runner's log to t.Log, so a failing run explains itself.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// running is one runner.Run in the background.
type running struct {
	done chan struct{}
	sum  Summary
	err  error
}

func startRun(t *testing.T, spec *job.Spec, st store.Store, noExport bool) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.sum, r.err = Run(ctx, Options{Spec: spec, Store: st, Logger: testLogger(t), ProgressEvery: time.Hour,
			DrainTimeout: 2 * time.Second, NoExport: noExport})
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// wait returns the run's result; the run must end within limit (a safety
// net for a wedged run, not a performance assertion).
func (r *running) wait(t *testing.T, limit time.Duration) (Summary, error) {
	t.Helper()
	select {
	case <-r.done:
		return r.sum, r.err
	case <-time.After(limit):
		t.Fatalf("run still going after %s", limit)
		return Summary{}, nil
	}
}

// waitFor polls cond until it holds, failing the test after limit or when
// the run ends first.
func waitFor(t *testing.T, r *running, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if r != nil {
			select {
			case <-r.done:
				if cond() {
					return
				}
				t.Fatalf("run ended (err %v) before %s", r.err, what)
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// events returns every event oldest first.
func events(t *testing.T, st store.Store) []store.Event {
	t.Helper()
	ev, err := st.Events(context.Background(), 100000)
	if err != nil {
		t.Fatalf("read events: %v", err)
	}
	slices.Reverse(ev)
	return ev
}

// endpointEvents returns the endpoint_state events after since, oldest first.
func endpointEvents(t *testing.T, st store.Store, since time.Time) []store.Event {
	var out []store.Event
	for _, e := range events(t, st) {
		if e.Kind == "endpoint_state" && !e.Time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

func states(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.State
	}
	return out
}

// firstState returns the first endpoint event entering state at or after since.
func firstState(t *testing.T, st store.Store, since time.Time, state string) (store.Event, bool) {
	for _, e := range endpointEvents(t, st, since) {
		if e.State == state {
			return e, true
		}
	}
	return store.Event{}, false
}

var pidRE = regexp.MustCompile(`\bpid (\d+)\b`)

// serverPID is the pid of the server launch that reached READY last: the
// STARTING event before it carries "pid N" as evidence.
func serverPID(t *testing.T, st store.Store) int {
	t.Helper()
	pid := 0
	for _, e := range endpointEvents(t, st, time.Time{}) {
		if e.State == "STARTING" {
			if m := pidRE.FindStringSubmatch(e.Evidence); m != nil {
				pid, _ = strconv.Atoi(m[1])
			}
		}
	}
	if pid == 0 {
		t.Fatalf("no STARTING event names a pid: %v", endpointEvents(t, st, time.Time{}))
	}
	return pid
}

func countState(t *testing.T, st store.Store, s store.State) int {
	t.Helper()
	counts, err := st.Counts(context.Background())
	if err != nil {
		t.Fatalf("counts: %v", err)
	}
	n := 0
	for _, c := range counts {
		if c.State == s {
			n += c.N
		}
	}
	return n
}

// waitReadyAndDone waits until the server is READY and at least n samples are done.
func waitDone(t *testing.T, r *running, st store.Store, n int) {
	t.Helper()
	waitFor(t, r, 60*time.Second, fmt.Sprintf("%d samples done", n), func() bool { return countState(t, st, store.Done) >= n })
}

// finishedRows reads every finished row.
func finishedRows(t *testing.T, st store.Store) []store.Row {
	t.Helper()
	var rows []store.Row
	if err := st.Finished(context.Background(), func(r store.Row) error {
		r.Body, r.Result.Response = nil, nil
		rows = append(rows, r)
		return nil
	}); err != nil {
		t.Fatalf("finished rows: %v", err)
	}
	return rows
}

// spentOn is the last error the store recorded for sample id (a retry or
// a dead letter spends an attempt and records why), for a failure message.
func spentOn(t *testing.T, st store.Store, id string) string {
	t.Helper()
	rows, err := st.LastErrors(context.Background(), 0)
	if err != nil {
		return "last errors: " + err.Error()
	}
	for _, r := range rows {
		if r.ID == id {
			return "last error: " + r.Reason
		}
	}
	return "no error recorded"
}

// checkExactlyOnce checks that every one of n samples is done once with
// wantAttempts attempts, and that the export holds each id once.
func checkExactlyOnce(t *testing.T, spec *job.Spec, st store.Store, sum Summary, n, wantAttempts int) {
	t.Helper()
	rows := finishedRows(t, st)
	if len(rows) != n {
		t.Errorf("finished rows: got %d, want %d", len(rows), n)
	}
	byAttempts := map[int]int{}
	for _, r := range rows {
		if r.State != store.Done {
			t.Errorf("sample %s: state %s (%s), want done", r.ID, r.State, r.Reason)
		}
		byAttempts[r.Attempts]++
		if r.Attempts != wantAttempts {
			t.Logf("sample %s: %d attempts (%s)", r.ID, r.Attempts, spentOn(t, st, r.ID))
		}
	}
	if want := map[int]int{wantAttempts: n}; !mapsEqual(byAttempts, want) {
		t.Errorf("samples per attempt count: got %v, want %v", byAttempts, want)
	}
	for _, s := range []store.State{store.Pending, store.Leased, store.Dead, store.Rejected} {
		if got := countState(t, st, s); got != 0 {
			t.Errorf("%s samples: got %d, want 0", s, got)
		}
	}
	if spec == nil {
		return
	}
	if len(sum.Export.Files) == 0 {
		t.Fatalf("no export files in summary %+v", sum.Export)
	}
	checkExportOnce(t, sum.Export.Files[0].Path, n)
}

// checkExportOnce checks that the exported JSONL file holds each of n ids once.
func checkExportOnce(t *testing.T, path string, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Done answers cut at max_tokens are beside data/, in the truncated file.
	trunc := filepath.Join(filepath.Dir(filepath.Dir(path)), strings.TrimSuffix(filepath.Base(path), ".sharegpt.jsonl")+".sharegpt.truncated.jsonl")
	if tb, err := os.ReadFile(trunc); err == nil {
		b = append(b, tb...)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("export line %q: %v", line, err)
		}
		seen[rec.ID]++
	}
	if len(seen) != n {
		t.Errorf("export %s: got %d distinct ids, want %d", filepath.Base(path), len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("export: id %s appears %d times", id, c)
		}
	}
}

func mapsEqual(a, b map[int]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// kill sends sig to pid and records when.
func kill(t *testing.T, pid int, sig syscall.Signal) time.Time {
	t.Helper()
	at := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("kill %d with %v: %v", pid, sig, err)
	}
	return at
}

// latencies collects measured detection latencies for one summary line per test binary run.
var latencies struct {
	sync.Mutex
	m map[string][]time.Duration
}

func recordLatency(t *testing.T, what string, d time.Duration) {
	t.Logf("latency %s: %v", what, d.Round(time.Millisecond))
	latencies.Lock()
	defer latencies.Unlock()
	if latencies.m == nil {
		latencies.m = map[string][]time.Duration{}
	}
	latencies.m[what] = append(latencies.m[what], d)
}

// errorsAs is errors.As for a target type, returning the match.
func errorsAs[T error](err error) (T, bool) {
	var target T
	ok := errors.As(err, &target)
	return target, ok
}
