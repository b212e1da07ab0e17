package supervise

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
)

var fakeServer string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "supervise-fake")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakeServer = filepath.Join(dir, "fakeserver")
	build := exec.Command("go", "build", "-o", fakeServer, "./testdata/fakeserver")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build fakeserver:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

type change struct {
	State State
	Cause string
	At    time.Time
}

// recorder collects OnState calls and lets a test wait for a state.
type recorder struct {
	mu      sync.Mutex
	changes []change
	last    Status
	wake    chan struct{}
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{}, 1)} }

func (r *recorder) onState(st Status) {
	r.mu.Lock()
	r.changes = append(r.changes, change{st.State, st.Cause, time.Now()})
	r.last = st
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// waitFor waits until the n-th occurrence (1-based) of state and returns it.
func (r *recorder) waitFor(t *testing.T, state State, n int, timeout time.Duration) change {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		seen := 0
		for _, c := range r.changes {
			if c.State == state {
				seen++
				if seen == n {
					r.mu.Unlock()
					return c
				}
			}
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-deadline:
			t.Fatalf("state %s #%d not reached within %v; states so far: %v", state, n, timeout, r.states())
		}
	}
}

func (r *recorder) states() []State {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]State, len(r.changes))
	for i, c := range r.changes {
		out[i] = c.State
	}
	return out
}

func (r *recorder) causeOf(state State, n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := 0
	for _, c := range r.changes {
		if c.State == state {
			if seen++; seen == n {
				return c.Cause
			}
		}
	}
	return ""
}

// fastConfig supervises the fake server with test-sized deadlines.
func fastConfig(t *testing.T, args ...string) Config {
	t.Helper()
	d, err := engine.Lookup("sglang")
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Server: job.Server{
			Engine:       "sglang",
			Command:      []string{fakeServer},
			Args:         args,
			ReadyTimeout: 20 * time.Second,
			Restart:      job.Restart{Max: 5, Window: time.Minute, Backoff: 20 * time.Millisecond},
		},
		Model:          "fake-model",
		Dialect:        d,
		LogPath:        filepath.Join(t.TempDir(), "server.log"),
		Logger:         slog.New(slog.DiscardHandler),
		HangTimeout:    time.Second,
		StallTimeout:   30 * time.Second,
		ProbeEvery:     200 * time.Millisecond,
		ProbeTimeout:   500 * time.Millisecond,
		ProbeFailures:  10,
		ReadyPollEvery: 50 * time.Millisecond,
		KillGrace:      2 * time.Second,
		FatalGrace:     time.Second,
		NvidiaSMI:      "-",
	}
}

type running struct {
	sup  *Supervisor
	rec  *recorder
	done chan error
	stop context.CancelFunc
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	rec := newRecorder()
	cfg.OnState = rec.onState
	sup, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{sup: sup, rec: rec, done: make(chan error, 1), stop: cancel}
	go func() { r.done <- sup.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

// stopAndCheck cancels Run and checks it returns nil with the group gone.
func (r *running) stopAndCheck(t *testing.T, pids ...int) {
	t.Helper()
	r.stop()
	select {
	case err := <-r.done:
		r.done <- err // for Cleanup
		if err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if got := r.sup.Status().State; got != Stopped {
		t.Errorf("state after stop = %s, want %s", got, Stopped)
	}
	for _, pid := range pids {
		if groupAlive(pid) {
			t.Errorf("process group %d still has live members after stop", pid)
		}
	}
}

func children(t *testing.T, leader int) []int {
	t.Helper()
	ms, err := groupMembers(leader)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for pid, m := range ms {
		if pid != leader && m.alive() {
			out = append(out, pid)
		}
	}
	return out
}

func TestKillLeaderRestarts(t *testing.T) {
	r := start(t, fastConfig(t, "--fork-child"))
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	st := r.sup.Status()
	old := st.PID
	if len(children(t, old)) != 1 {
		t.Fatalf("children of %d = %v, want one scheduler child", old, children(t, old))
	}
	killedAt := time.Now()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	down := r.rec.waitFor(t, Down, 1, 10*time.Second)
	t.Logf("leader SIGKILL -> DOWN detected in %v", down.At.Sub(killedAt))
	r.rec.waitFor(t, Ready, 2, 20*time.Second)
	if groupAlive(old) {
		t.Errorf("old process group %d still alive after restart", old)
	}
	st = r.sup.Status()
	if st.Restarts != 1 || st.PID == old || st.PID == 0 {
		t.Errorf("after restart: restarts=%d pid=%d (old %d), want 1 and a new pid", st.Restarts, st.PID, old)
	}
	want := []State{Starting, Ready, Down, Restarting, Starting, Ready}
	if diff := cmp.Diff(want, r.rec.states()); diff != "" {
		t.Errorf("states mismatch (-want +got):\n%s", diff)
	}
	if got := r.rec.causeOf(Down, 1); got != CauseExit {
		t.Errorf("DOWN cause = %q, want %q", got, CauseExit)
	}
	r.stopAndCheck(t, st.PID)
}

func TestChildExitIsDown(t *testing.T) {
	r := start(t, fastConfig(t, "--fork-child"))
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	leader := r.sup.Status().PID
	kids := children(t, leader)
	if len(kids) != 1 {
		t.Fatalf("children of %d = %v, want one", leader, kids)
	}
	killedAt := time.Now()
	if err := syscall.Kill(kids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	down := r.rec.waitFor(t, Down, 1, 10*time.Second)
	t.Logf("child SIGKILL (leader alive) -> DOWN detected in %v", down.At.Sub(killedAt))
	if down.Cause != CauseChildExit {
		t.Errorf("DOWN cause = %q, want %q", down.Cause, CauseChildExit)
	}
	r.rec.waitFor(t, Ready, 2, 20*time.Second)
	if groupAlive(leader) {
		t.Errorf("old leader %d's group still alive after restart", leader)
	}
	r.stopAndCheck(t, r.sup.Status().PID)
}

// streamer runs one long streaming request and reports token progress.
type streamer struct {
	mu       sync.Mutex
	inFlight int
	last     time.Time
	first    chan struct{}
}

func (s *streamer) progress() (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight, s.last
}

// start runs one streamed request to url until ctx ends and waits for its
// first token; the returned channel gives the request's end.
func (s *streamer) start(t *testing.T, ctx context.Context, url string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.run(ctx, url) }()
	select {
	case <-s.first:
	case err := <-done:
		t.Fatalf("stream ended before its first token: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no token within 10s")
	}
	return done
}

func (s *streamer) run(ctx context.Context, url string) error {
	body := strings.NewReader(`{"model":"fake-model","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"hi"}]}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	once := sync.Once{}
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			s.mu.Lock()
			s.last = time.Now()
			s.mu.Unlock()
			once.Do(func() { close(s.first) })
		}
	}
	return sc.Err()
}

func TestSIGSTOPIsStalledThenRestarts(t *testing.T) {
	st := &streamer{first: make(chan struct{})}
	cfg := fastConfig(t, "--fork-child")
	cfg.Progress = st.progress
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	leader := r.sup.Status().PID

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streamDone := st.start(t, ctx, r.sup.URL())
	stoppedAt := time.Now()
	if err := syscall.Kill(leader, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stalled := r.rec.waitFor(t, Stalled, 1, 10*time.Second)
	t.Logf("SIGSTOP with a request in flight -> STALLED in %v (hang timeout %v)", stalled.At.Sub(stoppedAt), cfg.HangTimeout)
	if stalled.Cause != CauseHang {
		t.Errorf("STALLED cause = %q, want %q", stalled.Cause, CauseHang)
	}
	r.rec.waitFor(t, Ready, 2, 20*time.Second)
	if groupAlive(leader) {
		t.Errorf("stopped group %d still alive after restart", leader)
	}
	cancel()
	<-streamDone
	// A health probe may time out against the stopped server before the
	// hang deadline passes, adding a DEGRADED step; that is fine.
	got := slices.DeleteFunc(r.rec.states(), func(s State) bool { return s == Degraded })
	want := []State{Starting, Ready, Stalled, Restarting, Starting, Ready}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("states mismatch (-want +got):\n%s", diff)
	}
	r.stopAndCheck(t, r.sup.Status().PID)
}

func TestHealthHangIsStalled(t *testing.T) {
	cfg := fastConfig(t, "--hang-after", "1s")
	cfg.ProbeFailures = 2
	cfg.Server.Restart.Max = 1 // the first STALLED ends the test with FAILED
	r := start(t, cfg)
	ready := r.rec.waitFor(t, Ready, 1, 20*time.Second)
	failed := r.rec.waitFor(t, Failed, 1, 20*time.Second)
	stalled := r.rec.waitFor(t, Stalled, 1, time.Second)
	t.Logf("health 503 from ~1s after launch -> STALLED %v after READY (probe every %v, %d failures)", stalled.At.Sub(ready.At), cfg.ProbeEvery, cfg.ProbeFailures)
	if stalled.Cause != CauseHealth || failed.Cause != CauseHealth {
		t.Errorf("causes STALLED=%q FAILED=%q, want %q", stalled.Cause, failed.Cause, CauseHealth)
	}
	want := []State{Starting, Ready, Degraded, Stalled, Failed}
	if diff := cmp.Diff(want, r.rec.states()); diff != "" {
		t.Errorf("states mismatch (-want +got):\n%s", diff)
	}
	var fe *FailedError
	if err := <-r.done; !errors.As(err, &fe) {
		t.Fatalf("Run = %v, want *FailedError", err)
	}
	r.done <- nil
}

func TestFrozenGenerationIsStalled(t *testing.T) {
	cfg := fastConfig(t, "--freeze-after", "500ms")
	cfg.StallTimeout = time.Second
	cfg.Server.Restart.Max = 1
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	stalled := r.rec.waitFor(t, Stalled, 1, 20*time.Second)
	if stalled.Cause != CauseNoGeneration {
		t.Errorf("STALLED cause = %q, want %q", stalled.Cause, CauseNoGeneration)
	}
	r.rec.waitFor(t, Failed, 1, 20*time.Second)
	ev := strings.Join(r.sup.Status().Evidence, "\n")
	if !strings.Contains(ev, "no generation for") || !strings.Contains(ev, "queued=1") {
		t.Errorf("evidence %q lacks the stall duration or the last metrics", ev)
	}
}

func TestCrashOnStartFails(t *testing.T) {
	cfg := fastConfig(t, "--crash-after", "0")
	r := start(t, cfg)
	var err error
	select {
	case err = <-r.done:
		r.done <- err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not give up")
	}
	var fe *FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("Run = %v, want *FailedError", err)
	}
	if fe.Cause != engine.CauseCUDAOOM || fe.Failures != 5 {
		t.Errorf("FailedError cause=%q failures=%d, want %q and 5", fe.Cause, fe.Failures, engine.CauseCUDAOOM)
	}
	if !strings.Contains(strings.Join(fe.Evidence, "\n"), "torch.OutOfMemoryError: CUDA out of memory") {
		t.Errorf("evidence %q lacks the OOM line", fe.Evidence)
	}
	var want []State
	for range 4 {
		want = append(want, Starting, Down, Restarting)
	}
	want = append(want, Starting, Down, Failed)
	if diff := cmp.Diff(want, r.rec.states()); diff != "" {
		t.Errorf("states mismatch (-want +got):\n%s", diff)
	}
	st := r.sup.Status()
	if st.State != Failed || st.Cause != engine.CauseCUDAOOM || st.Restarts != 4 {
		t.Errorf("final status %s cause %q restarts %d, want FAILED %q 4", st.State, st.Cause, st.Restarts, engine.CauseCUDAOOM)
	}
	// Backoff doubles from Restart.Backoff.
	log, _ := os.ReadFile(cfg.LogPath)
	if got := strings.Count(string(log), "# regen: launch "); got != 5 {
		t.Errorf("server log has %d launch headers, want 5", got)
	}
}

func TestSGLangCommandLine(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "argv.txt")
	script := filepath.Join(dir, "sglang-standin.sh")
	body := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s\nexec %s \"$@\"\n", record, fakeServer)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(t, "--fork-child", "--token-every", "5ms")
	cfg.Server.Command = []string{script}
	cfg.Server.Env = map[string]string{"SGLANG_HEALTH_CHECK_TIMEOUT": "20"}
	cfg.Model = "/models/Kimi K2.5"
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)

	raw, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	port := strconv.Itoa(r.sup.server.Port)
	want := []string{"--model-path", "/models/Kimi K2.5", "--host", "127.0.0.1", "--port", port, "--enable-metrics", "--fork-child", "--token-every", "5ms"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("recorded argv mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(append([]string{script}, want...), r.sup.Argv()); diff != "" {
		t.Errorf("Argv() mismatch (-want +got):\n%s", diff)
	}
	if r.sup.URL() != "http://127.0.0.1:"+port {
		t.Errorf("URL() = %q, want http://127.0.0.1:%s", r.sup.URL(), port)
	}
	// The script exec'd the server: the leader pid is the server's.
	if kids := children(t, r.sup.Status().PID); len(kids) != 1 {
		t.Errorf("children = %v, want the scheduler child", kids)
	}
	r.stopAndCheck(t, r.sup.Status().PID)
	log, _ := os.ReadFile(cfg.LogPath)
	if !strings.Contains(string(log), "max_total_num_tokens=100000") || !strings.Contains(string(log), `"/models/Kimi K2.5"`) {
		t.Errorf("server log lacks the server's output or the launch header:\n%s", log)
	}
}

func TestWaitReady(t *testing.T) {
	r := start(t, fastConfig(t, "--start-delay", "300ms"))
	d, _ := engine.Lookup("sglang")
	if err := WaitReady(context.Background(), r.sup.URL(), d, 20*time.Second); err != nil {
		t.Fatalf("WaitReady = %v, want nil", err)
	}
	r.stopAndCheck(t)
	err := WaitReady(context.Background(), r.sup.URL(), d, 300*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReady on a stopped server = %v, want a deadline error", err)
	}
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

func syscallGetpgrp() int { return syscall.Getpgrp() }

// TestStoppedStalledIsKilledAtOnce: a launched server SIGSTOPped with a
// request in flight is STALLED at the hang timeout and, being stopped
// (state T), killed with SIGKILL at once. The server ignores SIGTERM (as
// an engine busy shutting its workers down would for the whole grace) and
// the grace is ten minutes, so only the immediate SIGKILL ends it before
// the test's bound; the evidence says so.
func TestStoppedStalledIsKilledAtOnce(t *testing.T) {
	st := &streamer{first: make(chan struct{})}
	cfg := fastConfig(t, "--fork-child", "--ignore-term")
	cfg.Progress = st.progress
	cfg.KillGrace = 10 * time.Minute
	cfg.Server.Restart.Max = 1 // the first STALLED ends the test with FAILED: nothing left to stop
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	leader := r.sup.Status().PID

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streamDone := st.start(t, ctx, r.sup.URL())
	if err := syscall.Kill(leader, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stalled := r.rec.waitFor(t, Stalled, 1, 10*time.Second)
	failed := r.rec.waitFor(t, Failed, 1, time.Minute) // far below the 10 min grace
	t.Logf("stopped server: STALLED to killed and FAILED in %v (SIGTERM grace %v)", failed.At.Sub(stalled.At), cfg.KillGrace)
	if groupAlive(leader) {
		t.Errorf("stopped group %d still alive", leader)
	}
	ev := strings.Join(r.sup.Status().Evidence, "; ")
	if want := fmt.Sprintf("[%d] stopped (state T): killed at once (SIGKILL)", leader); !strings.Contains(ev, want) {
		t.Errorf("evidence %q lacks %q", ev, want)
	}
	cancel()
	<-streamDone
	var fe *FailedError
	if err := <-r.done; !errors.As(err, &fe) {
		t.Fatalf("Run = %v, want *FailedError", err)
	}
	r.done <- nil
}
