package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/probe"
)

// Defaults for zero Config and job.Server fields; those a job file can set
// are the job's own defaults, so the two never disagree.
const (
	DefaultHangTimeout       = job.DefaultHangTimeout
	DefaultStallTimeout      = 2 * time.Minute
	DefaultProbeEvery        = 5 * time.Second
	DefaultProbeFailures     = 3
	DefaultPollEvery         = 250 * time.Millisecond
	DefaultReadyTimeout      = job.DefaultReadyTimeout
	DefaultReadyPollEvery    = 500 * time.Millisecond
	DefaultKillGrace         = 15 * time.Second
	DefaultFatalGrace        = 5 * time.Second
	DefaultChildMinAge       = 10 * time.Second
	DefaultGPUReleaseTimeout = 2 * time.Minute
	DefaultRestartMax        = job.DefaultRestartMax
	DefaultRestartWindow     = job.DefaultRestartWindow
	DefaultRestartBackoff    = job.DefaultRestartBackoff
	DefaultMaxBackoff        = 5 * time.Minute
	DefaultLogMaxBytes       = 64 << 20
	DefaultLogKeep           = 3
	DefaultRetractsPerMinute = 6
)

// Config configures a Supervisor. Zero durations and counts take the
// Default* values above; Server.HangTimeout, Server.ReadyTimeout and
// Server.Restart are read from the job.
type Config struct {
	Server  job.Server
	Model   string
	Dialect engine.Dialect
	// Dir is the server's working directory ("" = regen's).
	Dir string
	// LogPath receives the server's stdout and stderr ("" = not kept).
	LogPath     string
	LogMaxBytes int64 // rotate when a write would pass this size
	LogKeep     int   // rotated files kept: LogPath.1 ... LogPath.N
	Logger      *slog.Logger

	// OnState is called on every state change, always from the goroutine
	// that called Run, before the supervisor acts on the change (so the
	// dispatcher is paused before the group is killed). It must not block long.
	OnState func(Status)
	// Progress returns the dispatcher's evidence of token flow for this
	// server: requests in flight and when the last token arrived.
	Progress func() (inFlight int, lastToken time.Time)
	// OnProbe receives every probe taken after readiness (health and
	// metrics), from Run's goroutine, before the supervisor judges it; the
	// dispatcher's adaptive limits feed on the metrics. It must not block long.
	OnProbe func(probe.Snapshot)

	HangTimeout       time.Duration // in flight, no token: STALLED (default Server.HangTimeout, then 30s)
	StallTimeout      time.Duration // work queued, no generation anywhere: STALLED
	ProbeEvery        time.Duration // health and metrics probe interval after readiness
	ProbeTimeout      time.Duration // one probe request (default the dialect's, 25s)
	ProbeFailures     int           // consecutive failed probes that make STALLED
	PollEvery         time.Duration // /proc scan and deadline checks
	ReadyPollEvery    time.Duration // readiness endpoint polling while STARTING
	KillGrace         time.Duration // SIGTERM to SIGKILL
	FatalGrace        time.Duration // a fatal log line with the process still alive: DOWN after this
	ChildMinAge       time.Duration // a child appearing after readiness is watched once this old
	GPUReleaseTimeout time.Duration
	MaxBackoff        time.Duration
	RetractsPerMinute int // retractions per minute that make DEGRADED
	// NvidiaSMI is the nvidia-smi path: "" looks it up on PATH, "-" disables the GPU wait.
	NvidiaSMI string
	// Client is used for probes (default: a client without overall timeout;
	// each request is bounded by ProbeTimeout).
	Client *http.Client
	Now    func() time.Time

	gpuPoll time.Duration // nvidia-smi polling interval; tests shorten it
	// reapGrace is how long drain waits for the leader's reap beyond
	// KillGrace (default 10s); tests shorten it.
	reapGrace time.Duration
	// reap waits for the launched process (default cmd.Wait); tests replace
	// it to model a leader the kernel never lets go of.
	reap func(*exec.Cmd) error
}

// Supervisor runs and watches one server. Create it with New, then call Run once.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	url     string
	server  job.Server // with the port resolved
	smi     string
	restart job.Restart

	mu     sync.Mutex
	status Status
	ran    bool
}

// New validates cfg, fills defaults and picks a free port when
// Server.Port is 0 (kept across restarts, so the URL never changes).
func New(cfg Config) (*Supervisor, error) {
	if cfg.Dialect.Name == "" {
		d, err := engine.Lookup(cfg.Server.Engine)
		if err != nil {
			return nil, fmt.Errorf("supervise: %w", err)
		}
		cfg.Dialect = d
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if cfg.HangTimeout <= 0 {
		cfg.HangTimeout = cfg.Server.HangTimeout
	}
	def(&cfg.HangTimeout, DefaultHangTimeout)
	def(&cfg.StallTimeout, DefaultStallTimeout)
	def(&cfg.ProbeEvery, DefaultProbeEvery)
	def(&cfg.ProbeTimeout, cfg.Dialect.ProbeTimeout)
	def(&cfg.ProbeTimeout, engine.DefaultProbeTimeout)
	def(&cfg.PollEvery, DefaultPollEvery)
	def(&cfg.ReadyPollEvery, DefaultReadyPollEvery)
	def(&cfg.KillGrace, DefaultKillGrace)
	def(&cfg.FatalGrace, DefaultFatalGrace)
	def(&cfg.ChildMinAge, DefaultChildMinAge)
	def(&cfg.GPUReleaseTimeout, DefaultGPUReleaseTimeout)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	if cfg.ProbeFailures <= 0 {
		cfg.ProbeFailures = DefaultProbeFailures
	}
	if cfg.RetractsPerMinute <= 0 {
		cfg.RetractsPerMinute = DefaultRetractsPerMinute
	}
	if cfg.LogMaxBytes <= 0 {
		cfg.LogMaxBytes = DefaultLogMaxBytes
	}
	if cfg.LogKeep <= 0 {
		cfg.LogKeep = DefaultLogKeep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Client == nil {
		// Our own transport, so closing its idle connections at the end of
		// Run touches nobody else's.
		cfg.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	cfg.Dialect.ProbeTimeout = cfg.ProbeTimeout

	if cfg.gpuPoll <= 0 {
		cfg.gpuPoll = time.Second
	}
	def(&cfg.reapGrace, 10*time.Second)
	if cfg.reap == nil {
		cfg.reap = (*exec.Cmd).Wait
	}
	s := &Supervisor{cfg: cfg, server: cfg.Server, restart: cfg.Server.Restart}
	if s.restart.Max <= 0 {
		s.restart.Max = DefaultRestartMax
	}
	if s.restart.Window <= 0 {
		s.restart.Window = DefaultRestartWindow
	}
	if s.restart.Backoff <= 0 {
		s.restart.Backoff = DefaultRestartBackoff
	}
	if s.server.Host == "" {
		s.server.Host = "127.0.0.1"
	}
	if s.server.Port == 0 {
		port, err := freePort(s.server.Host)
		if err != nil {
			return nil, fmt.Errorf("supervise: pick a port: %w", err)
		}
		s.server.Port = port
	}
	if s.server.ReadyTimeout <= 0 {
		s.server.ReadyTimeout = DefaultReadyTimeout
	}
	s.url = "http://" + net.JoinHostPort(dialHost(s.server.Host), strconv.Itoa(s.server.Port))
	switch cfg.NvidiaSMI {
	case "-":
	case "":
		if p, err := exec.LookPath("nvidia-smi"); err == nil {
			s.smi = p
		}
	default:
		s.smi = cfg.NvidiaSMI
	}
	s.log = cfg.Logger.With("engine", cfg.Dialect.Name, "url", s.url)
	s.status = Status{State: Stopped, URL: s.url, Since: cfg.Now()}
	return s, nil
}

// URL is the server's base URL (http://host:port), fixed for the supervisor's life.
func (s *Supervisor) URL() string { return s.url }

// Argv is the command line the supervisor launches.
func (s *Supervisor) Argv() []string { return s.cfg.Dialect.LaunchArgs(s.server, s.cfg.Model) }

// Status returns the current status; safe from any goroutine.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status.clone()
}

// Run launches the server and supervises it until ctx is cancelled (the
// group is stopped, the state becomes STOPPED and Run returns nil) or the
// restart policy is exhausted (FAILED, and a *FailedError is returned).
func (s *Supervisor) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("supervise: Run called twice")
	}
	s.ran = true
	s.mu.Unlock()
	defer s.cfg.Client.CloseIdleConnections()

	policy := RestartPolicy{Restart: s.restart, MaxBackoff: s.cfg.MaxBackoff}
	restarts := 0
	for {
		out := s.runOnce(ctx, restarts)
		if out.stopped {
			s.setState(Stopped, CauseStopped, nil, 0)
			return nil
		}
		delay, failures, ok := policy.Fail(s.cfg.Now())
		if !ok {
			s.setState(Failed, out.cause, out.evidence, 0)
			s.log.Error("server_failed", "cause", out.cause, "failures", failures, "window", s.restart.Window)
			return &FailedError{Cause: out.cause, Evidence: out.evidence, Failures: failures, Window: s.restart.Window}
		}
		ev := append(slices.Clone(out.evidence), fmt.Sprintf("restart %d in %v (failure %d of %d within %v)", restarts+1, delay, failures, s.restart.Max, s.restart.Window))
		s.setState(Restarting, out.cause, ev, 0)
		select {
		case <-ctx.Done():
			s.setState(Stopped, CauseStopped, nil, 0)
			return nil
		case <-time.After(delay):
		}
		restarts++
		s.mu.Lock()
		s.status.Restarts = restarts
		s.mu.Unlock()
	}
}

// backoff is base doubled for each earlier failure, capped.
// RestartPolicy counts a server's failures within a window and yields the
// delay before the next start; the Max-th failure within Window is final.
// Both the supervised process and the in-process simulator restart by it.
type RestartPolicy struct {
	Restart    job.Restart
	MaxBackoff time.Duration
	failures   []time.Time
}

// Fail records a failure at now. It returns the backoff before the next
// start, the failures counted within the window, and ok=false when the
// policy is exhausted.
func (p *RestartPolicy) Fail(now time.Time) (delay time.Duration, failures int, ok bool) {
	p.failures = slices.DeleteFunc(p.failures, func(t time.Time) bool { return now.Sub(t) > p.Restart.Window })
	p.failures = append(p.failures, now)
	if len(p.failures) >= p.Restart.Max {
		return 0, len(p.failures), false
	}
	return backoff(p.Restart.Backoff, p.MaxBackoff, len(p.failures)), len(p.failures), true
}

// Failures is how many failures were counted within the window at the last Fail.
func (p *RestartPolicy) Failures() int { return len(p.failures) }

func backoff(base, capped time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < capped; i++ {
		d *= 2
	}
	return min(d, capped)
}

type outcome struct {
	stopped  bool
	cause    string
	evidence []string
}

type exitInfo struct {
	state *os.ProcessState
	err   error
}

// incarnation is one launch of the server.
type incarnation struct {
	cmd      *exec.Cmd
	pid      int
	watch    *logWatch
	exited   chan exitInfo
	logDone  chan struct{}
	readyCh  chan struct{}
	probes   chan probe.Snapshot
	pipe     *os.File
	seenPIDs map[int]bool
}

// runOnce launches the server, waits for it to fail or for ctx to end, and
// cleans up the group before returning.
func (s *Supervisor) runOnce(ctx context.Context, restarts int) outcome {
	argv := s.Argv()
	ictx, cancel := context.WithCancel(ctx)
	// wg holds the log reader and the probe loops only: they end when ictx
	// is cancelled or drain closes the pipe, so this wait is bounded.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	var logOut io.Writer
	if s.cfg.LogPath != "" {
		rf, err := openRotating(s.cfg.LogPath, s.cfg.LogMaxBytes, s.cfg.LogKeep)
		if err != nil {
			return s.startFailed(fmt.Errorf("server log %s: %w", s.cfg.LogPath, err))
		}
		defer rf.Close()
		fmt.Fprintf(rf, "# regen: launch %d at %s: %s\n", restarts+1, s.cfg.Now().Format(time.RFC3339), strings.Join(quoteArgs(argv), " "))
		logOut = rf
	}

	pr, pw, err := os.Pipe()
	if err != nil {
		return s.startFailed(fmt.Errorf("pipe: %w", err))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.cfg.Dir
	cmd.Env = mergeEnv(os.Environ(), s.server.Env)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	inc := &incarnation{
		cmd:      cmd,
		watch:    newLogWatch(s.cfg.Dialect, logOut, s.cfg.Now),
		exited:   make(chan exitInfo, 1),
		logDone:  make(chan struct{}),
		readyCh:  make(chan struct{}),
		probes:   make(chan probe.Snapshot),
		pipe:     pr,
		seenPIDs: make(map[int]bool),
	}
	started := make(chan error, 1)
	// The reaper is not in wg: a killed leader stuck in uninterruptible
	// sleep (a GPU driver call) is never reaped, and drain gives up on it
	// after a bounded wait. Waiting for the reaper here would then hang
	// runOnce, and with it every restart, forever. Left alone it stays
	// harmless: exited is buffered, so its one send never blocks.
	go func() {
		// Pdeathsig fires when the thread that forked the child exits, not
		// the process, so that thread stays locked until the child is reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := s.cfg.reap(cmd)
		inc.exited <- exitInfo{state: cmd.ProcessState, err: err}
	}()
	err = <-started
	pw.Close()
	if err != nil {
		pr.Close()
		return s.startFailed(fmt.Errorf("start %s: %w", argv[0], err))
	}
	inc.pid = cmd.Process.Pid
	inc.seenPIDs[inc.pid] = true
	wg.Go(func() {
		defer close(inc.logDone)
		inc.watch.run(pr)
	})
	defer pr.Close()
	s.log.Info("server_launch", "pid", inc.pid, "argv", argv, "launch", restarts+1)
	s.setState(Starting, "", []string{"pid " + strconv.Itoa(inc.pid), "argv " + strings.Join(quoteArgs(argv), " ")}, inc.pid)

	wg.Go(func() { s.pollReady(ictx, inc) })
	return s.watchLoop(ctx, ictx, inc, &wg)
}

func (s *Supervisor) startFailed(err error) outcome {
	s.setState(Down, CauseStart, []string{err.Error()}, 0)
	s.log.Error("server_start", "err", err)
	return outcome{cause: CauseStart, evidence: []string{err.Error()}}
}

// pollReady closes inc.readyCh once the readiness endpoint answers 200.
func (s *Supervisor) pollReady(ctx context.Context, inc *incarnation) {
	url := s.url + s.cfg.Dialect.ReadyPath
	t := time.NewTicker(s.cfg.ReadyPollEvery)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		code, err := probe.Health(rctx, s.cfg.Client, url)
		cancel()
		if err == nil && code == http.StatusOK {
			close(inc.readyCh)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probeLoop sends one snapshot per ProbeEvery until ctx ends.
func (s *Supervisor) probeLoop(ctx context.Context, inc *incarnation) {
	for {
		snap := probe.Probe(ctx, s.cfg.Client, s.url, s.cfg.Dialect)
		select {
		case <-ctx.Done():
			return
		case inc.probes <- snap:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.ProbeEvery):
		}
	}
}

// watch holds the per-incarnation judgement state.
type watch struct {
	state      State
	readyAt    time.Time
	startedAt  time.Time
	watched    map[int]string // child pid -> comm, watched for exit
	firstSeen  map[int]time.Time
	probeFails int
	lastProbe  string
	lastGen    float64
	lastGenAt  time.Time
	haveGen    bool
	metrics    engine.Metrics
	metricsAt  time.Time
}

func (s *Supervisor) watchLoop(ctx, ictx context.Context, inc *incarnation, wg *sync.WaitGroup) outcome {
	now := s.cfg.Now()
	w := &watch{state: Starting, startedAt: now, watched: map[int]string{}, firstSeen: map[int]time.Time{}}
	tick := time.NewTicker(s.cfg.PollEvery)
	defer tick.Stop()
	readyCh := inc.readyCh

	becomeReady := func(how string) {
		now := s.cfg.Now()
		w.readyAt, w.lastGenAt = now, now
		ms, _ := groupMembers(inc.pid)
		for pid, m := range ms {
			inc.seenPIDs[pid] = true
			if pid != inc.pid && m.alive() {
				w.watched[pid] = m.Comm
			}
		}
		w.state = Ready
		s.setState(Ready, "", []string{how, fmt.Sprintf("ready after %.1fs", now.Sub(w.startedAt).Seconds()), fmt.Sprintf("watching %d child processes", len(w.watched))}, inc.pid)
		s.log.Info("server_ready", "pid", inc.pid, "how", how, "children", len(w.watched))
		wg.Go(func() { s.probeLoop(ictx, inc) })
	}

	for {
		select {
		case <-ctx.Done():
			s.log.Info("server_stop", "pid", inc.pid)
			if err := killGroup(inc.pid, s.cfg.KillGrace, s.cfg.PollEvery); err != nil {
				s.log.Error("server_stop", "err", err)
			}
			s.drain(inc)
			return outcome{stopped: true}

		case ex := <-inc.exited:
			inc.exited <- ex // keep it for cleanup
			return s.fail(inc, w, Down, CauseExit, []string{describeExit(ex)}, true)

		case <-inc.watch.notify:
			if w.state == Starting && inc.watch.isReady() {
				becomeReady("ready line logged")
			}

		case <-readyCh:
			readyCh = nil
			if w.state == Starting {
				becomeReady("GET " + s.cfg.Dialect.ReadyPath + " 200")
			}

		case snap := <-inc.probes:
			if s.cfg.OnProbe != nil {
				s.cfg.OnProbe(snap)
			}
			// A probe refused by a server that just died says nothing new:
			// let the exit, which carries the evidence, win the race.
			if !snap.Healthy() && !processAlive(inc.pid) {
				select {
				case ex := <-inc.exited:
					inc.exited <- ex
					return s.fail(inc, w, Down, CauseExit, []string{describeExit(ex)}, true)
				case <-time.After(time.Second):
				}
			}
			if out, failed := s.judgeProbe(inc, w, snap); failed {
				return out
			}

		case <-tick.C:
			if out, failed := s.judgeTick(inc, w); failed {
				return out
			}
		}
	}
}

func (s *Supervisor) judgeTick(inc *incarnation, w *watch) (outcome, bool) {
	now := s.cfg.Now()
	// A fatal line while the process lives: give the engine FatalGrace to
	// tear itself down (SGLang dumps in-flight requests first), then act.
	if cause, lines, first := inc.watch.rootCause(); cause != "" && now.Sub(first) >= s.cfg.FatalGrace {
		ev := append([]string{fmt.Sprintf("fatal log line, process still alive %.1fs later", now.Sub(first).Seconds())}, lines...)
		return s.fail(inc, w, Down, cause, ev, false), true
	}
	if w.state == Starting {
		if now.Sub(w.startedAt) >= s.server.ReadyTimeout {
			return s.fail(inc, w, Down, CauseReadyTimeout, []string{fmt.Sprintf("not ready after %v (GET %s)", s.server.ReadyTimeout, s.cfg.Dialect.ReadyPath)}, false), true
		}
		if ms, err := groupMembers(inc.pid); err == nil {
			for pid := range ms {
				inc.seenPIDs[pid] = true
			}
		}
		return outcome{}, false
	}

	// Group members: any watched child gone while the leader lives is a crash.
	if ms, err := groupMembers(inc.pid); err == nil {
		for pid, comm := range w.watched {
			if m, ok := ms[pid]; !ok || !m.alive() {
				return s.fail(inc, w, Down, CauseChildExit, []string{fmt.Sprintf("child pid %d (%s) exited while leader pid %d runs", pid, comm, inc.pid)}, false), true
			}
		}
		for pid, m := range ms {
			inc.seenPIDs[pid] = true
			if pid == inc.pid || !m.alive() {
				continue
			}
			if _, ok := w.watched[pid]; ok {
				continue
			}
			first, ok := w.firstSeen[pid]
			if !ok {
				w.firstSeen[pid] = now
			} else if now.Sub(first) >= s.cfg.ChildMinAge {
				w.watched[pid] = m.Comm
				delete(w.firstSeen, pid)
			}
		}
		for pid := range w.firstSeen {
			if _, ok := ms[pid]; !ok {
				delete(w.firstSeen, pid) // short-lived helper, not a server process
			}
		}
	}

	// Hang: the dispatcher has requests out but hears nothing.
	inFlight, lastToken := 0, time.Time{}
	if s.cfg.Progress != nil {
		inFlight, lastToken = s.cfg.Progress()
		ref := lastToken
		if ref.Before(w.readyAt) {
			ref = w.readyAt
		}
		if inFlight > 0 && now.Sub(ref) >= s.cfg.HangTimeout {
			ev := []string{fmt.Sprintf("no token for %.1fs with %d requests in flight", now.Sub(ref).Seconds(), inFlight)}
			return s.fail(inc, w, Stalled, CauseHang, ev, false), true
		}
		if lastToken.After(w.lastGenAt) {
			w.lastGenAt = lastToken
		}
	}

	// Stall: work queued but no sign of generation from any source.
	if g := inc.watch.generationAt(); g.After(w.lastGenAt) {
		w.lastGenAt = g
	}
	// Work waiting: the dispatcher's in-flight count when it is wired, else
	// the waiting queue. Running alone is not trusted: SGLang's gauges keep
	// their last value on an idle server.
	waiting := inFlight > 0
	if s.cfg.Progress == nil {
		waiting = w.metrics.Present.Has(engine.FieldQueued) && w.metrics.Queued > 0
	}
	if !waiting {
		w.lastGenAt = now
	} else if now.Sub(w.lastGenAt) >= s.cfg.StallTimeout {
		ev := []string{fmt.Sprintf("no generation for %.1fs with %d in flight, %.0f running, %.0f queued", now.Sub(w.lastGenAt).Seconds(), inFlight, w.metrics.Running, w.metrics.Queued)}
		return s.fail(inc, w, Stalled, CauseNoGeneration, ev, false), true
	}

	s.judgeDegraded(inc, w)
	return outcome{}, false
}

func (s *Supervisor) judgeProbe(inc *incarnation, w *watch, snap probe.Snapshot) (outcome, bool) {
	if snap.MetricsErr == nil {
		w.metrics, w.metricsAt = snap.Metrics, snap.Time
		s.mu.Lock()
		s.status.Metrics, s.status.MetricsAt = snap.Metrics, snap.Time
		s.mu.Unlock()
		if snap.Metrics.Present.Has(engine.FieldGenerationTokensTotal) {
			if !w.haveGen || snap.Metrics.GenerationTokensTotal != w.lastGen {
				if w.haveGen {
					w.lastGenAt = snap.Time
				}
				w.lastGen, w.haveGen = snap.Metrics.GenerationTokensTotal, true
			}
		}
	}
	if snap.Healthy() {
		w.probeFails = 0
	} else {
		w.probeFails++
		if snap.HealthErr != nil {
			w.lastProbe = fmt.Sprintf("GET %s: %v", s.cfg.Dialect.HealthPath, snap.HealthErr)
		} else {
			w.lastProbe = fmt.Sprintf("GET %s: status %d after %v", s.cfg.Dialect.HealthPath, snap.HealthStatus, snap.HealthLatency.Round(time.Millisecond))
		}
		if w.probeFails >= s.cfg.ProbeFailures {
			ev := []string{fmt.Sprintf("%d health probes failed in a row", w.probeFails), w.lastProbe}
			return s.fail(inc, w, Stalled, CauseHealth, ev, false), true
		}
	}
	s.judgeDegraded(inc, w)
	return outcome{}, false
}

// judgeDegraded moves between READY and DEGRADED.
func (s *Supervisor) judgeDegraded(inc *incarnation, w *watch) {
	if w.state != Ready && w.state != Degraded {
		return
	}
	now := s.cfg.Now()
	cause, ev := "", []string(nil)
	if w.probeFails > 0 {
		cause, ev = CauseHealthProbe, []string{fmt.Sprintf("%d health probe(s) failed", w.probeFails), w.lastProbe}
	} else if n := inc.watch.retractionsSince(now.Add(-time.Minute)); n >= s.cfg.RetractsPerMinute {
		cause, ev = CauseRetractions, []string{fmt.Sprintf("%d KV retractions in the last minute", n)}
	}
	switch {
	case cause != "" && w.state == Ready:
		w.state = Degraded
		s.setState(Degraded, cause, ev, inc.pid)
	case cause == "" && w.state == Degraded:
		w.state = Ready
		s.setState(Ready, "", []string{"recovered"}, inc.pid)
	}
}

// exitLogWait bounds the wait for the log's last lines after the leader
// exited.
const exitLogWait = 500 * time.Millisecond

// fail reports DOWN or STALLED, kills the group, waits for the log to drain
// and for GPU memory to be released, and returns the outcome with the most
// specific cause known by then.
func (s *Supervisor) fail(inc *incarnation, w *watch, state State, cause string, evidence []string, leaderExited bool) outcome {
	if leaderExited {
		// The last lines (the traceback naming the cause) may still be in
		// the pipe; give the reader until it ends (at once, normally) or a
		// bound, for a child that keeps the pipe open. 100 ms missed the
		// traceback on a loaded 2-core CI machine.
		select {
		case <-inc.logDone:
		case <-time.After(exitLogWait):
		}
	}
	// A stopped process cannot act on SIGTERM until continued, and one
	// that hung is not worth the grace: STALLED and stopped is killed now.
	grace := s.cfg.KillGrace
	if stopped := stoppedMembers(inc.pid); state == Stalled && len(stopped) > 0 {
		grace = 0
		evidence = append(evidence, fmt.Sprintf("process %v stopped (state T): killed at once (SIGKILL) without the %s SIGTERM grace", stopped, s.cfg.KillGrace))
	}
	cause, evidence = s.explain(inc, w, state, cause, evidence)
	w.state = state
	s.setState(state, cause, evidence, inc.pid)
	s.log.Warn("server_"+strings.ToLower(string(state)), "cause", cause, "pid", inc.pid, "evidence", evidence)

	if err := killGroup(inc.pid, grace, s.cfg.PollEvery); err != nil {
		s.log.Error("server_kill", "err", err)
		evidence = append(evidence, err.Error())
	}
	s.drain(inc)
	if s.smi != "" {
		if held, err := waitGPURelease(context.Background(), s.smi, inc.seenPIDs, s.cfg.GPUReleaseTimeout, s.cfg.gpuPoll); err != nil {
			s.log.Warn("gpu_release", "err", err, "pids", held)
			evidence = append(evidence, err.Error())
		}
	}
	// Lines read after the report may name the root cause better.
	cause, evidence = s.explain(inc, w, state, cause, evidence)
	s.mu.Lock()
	s.status.Cause, s.status.Evidence, s.status.PID = cause, slices.Clone(evidence), 0
	s.mu.Unlock()
	return outcome{cause: cause, evidence: evidence}
}

// explain upgrades the cause of a DOWN to the log's root cause and adds
// the matching log lines (or the log tail when none matched) and the last
// metrics as evidence. Evidence already present is not repeated.
func (s *Supervisor) explain(inc *incarnation, w *watch, state State, cause string, evidence []string) (string, []string) {
	logCause, lines, _ := inc.watch.rootCause()
	if state == Down && engine.CausePriority(logCause) > engine.CausePriority(cause) {
		cause = logCause
	}
	add := func(e string) {
		if !slices.Contains(evidence, e) {
			evidence = append(evidence, e)
		}
	}
	if len(lines) > 0 {
		for _, l := range lines {
			add("log: " + l)
		}
	} else if state == Down {
		for _, l := range inc.watch.lastLines(5) {
			add("log tail: " + l)
		}
	}
	if !w.readyAt.IsZero() {
		add(fmt.Sprintf("up %.1fs", s.cfg.Now().Sub(w.readyAt).Seconds()))
	}
	if s.cfg.Progress != nil {
		inFlight, last := s.cfg.Progress()
		if !last.IsZero() {
			add(fmt.Sprintf("last token %.1fs ago, %d in flight", s.cfg.Now().Sub(last).Seconds(), inFlight))
		}
	}
	if !w.metricsAt.IsZero() {
		m := w.metrics
		add(fmt.Sprintf("last metrics %.1fs ago: %s", s.cfg.Now().Sub(w.metricsAt).Seconds(), m.Evidence()))
	}
	return cause, evidence
}

// drain waits for the leader to be reaped and the log reader to finish.
// A process outside the group may still hold the pipe, so the wait is bounded.
func (s *Supervisor) drain(inc *incarnation) {
	select {
	case <-inc.exited:
	case <-time.After(s.cfg.KillGrace + s.cfg.reapGrace):
		s.log.Error("server_reap", "pid", inc.pid, "err", "leader not reaped")
	}
	select {
	case <-inc.logDone:
	case <-time.After(2 * time.Second):
		inc.pipe.Close() // unblocks the reader
		<-inc.logDone
	}
	inc.watch.mu.Lock()
	werr := inc.watch.writeErr
	inc.watch.mu.Unlock()
	if werr != nil {
		s.log.Error("server_log", "path", s.cfg.LogPath, "err", werr)
	}
}

func (s *Supervisor) setState(state State, cause string, evidence []string, pid int) {
	s.mu.Lock()
	changed := s.status.State != state
	s.status.State = state
	s.status.Cause = cause
	s.status.Evidence = slices.Clone(evidence)
	s.status.PID = pid
	if changed {
		s.status.Since = s.cfg.Now()
	}
	st := s.status.clone()
	s.mu.Unlock()
	if changed {
		s.log.Info("server_state", "state", state, "cause", cause)
		if s.cfg.OnState != nil {
			s.cfg.OnState(st)
		}
	}
}

func describeExit(ex exitInfo) string {
	st := ex.state
	if st == nil {
		return fmt.Sprintf("leader exited: %v", ex.err)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("leader pid %d killed by signal %s", st.Pid(), ws.Signal())
	}
	return fmt.Sprintf("leader pid %d exited with code %d", st.Pid(), st.ExitCode())
}

// mergeEnv overrides base with extra; new keys are appended in sorted order.
func mergeEnv(base []string, extra map[string]string) []string {
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := extra[k]; ok {
			continue
		}
		out = append(out, kv)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+extra[k])
	}
	return out
}

func quoteArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(dialHost(host), "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// dialHost maps a wildcard bind address to loopback for connecting.
func dialHost(h string) string {
	switch h {
	case "", "0.0.0.0":
		return "127.0.0.1"
	case "::", "[::]":
		return "::1"
	}
	return strings.Trim(h, "[]")
}

// WaitReady polls url's readiness endpoint (the dialect's ReadyPath) until it
// answers 200, for servers regen did not launch. It returns an error naming
// the last answer when timeout passes or ctx ends first.
func WaitReady(ctx context.Context, url string, d engine.Dialect, timeout time.Duration) error {
	url = strings.TrimRight(url, "/") + d.ReadyPath
	probeTimeout := d.ProbeTimeout
	if probeTimeout <= 0 {
		probeTimeout = engine.DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	last := "no answer"
	for {
		rctx, rcancel := context.WithTimeout(ctx, probeTimeout)
		code, err := probe.Health(rctx, client, url)
		rcancel()
		switch {
		case err == nil && code == http.StatusOK:
			return nil
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("status %d", code)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait ready %s: %w (last: %s)", url, ctx.Err(), last)
		case <-time.After(DefaultReadyPollEvery):
		}
	}
}
