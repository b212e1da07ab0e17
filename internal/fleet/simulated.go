package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/supervise"
)

// simFleet runs the built-in simulator in this process (engine: sim with no
// command): the embedded default, so a job runs on a laptop with no server.
// Crashes injected into it are handled like a real server's: DOWN, pause,
// restart with backoff, READY; token silence with work in flight is a hang.
type simFleet struct {
	*statusBoard
	cfg     sim.Config
	addr    string
	url     string
	logOut  io.Writer
	logFile io.Closer
	log     *slog.Logger
	restart supervise.RestartPolicy
	hang    time.Duration
	every   time.Duration // probe period
	// fatal reads the simulator's log as the supervisor reads a server's,
	// so a crash is reported with the cause its log names (cuda_oom).
	fatal *fatalWatch
}

func newSimFleet(spec *job.Spec, logDir string, log *slog.Logger, onState stateFunc) (*simFleet, error) {
	cfg := sim.DefaultConfig()
	if spec.Model != "" {
		cfg.ModelName = spec.Model
	}
	if err := cfg.Apply(spec.Server.Sim); err != nil {
		return nil, fmt.Errorf("%s: server.sim: %w", spec.Path, err)
	}
	if cfg.HiddenStates != "" && !filepath.IsAbs(cfg.HiddenStates) {
		// Paths in a job file are relative to it.
		cfg.HiddenStates = filepath.Join(filepath.Dir(spec.Path), cfg.HiddenStates)
	}
	addr, err := freeLoopbackAddr(spec.Server.Host, spec.Server.Port)
	if err != nil {
		return nil, err
	}
	logFile, err := openLog(logDir, "sim.log")
	if err != nil {
		return nil, err
	}
	url := "http://" + addr
	every := probeEvery(spec)
	fw := &fatalWatch{}
	return &simFleet{statusBoard: newStatusBoard([]string{url}, onState), cfg: cfg, addr: addr, url: url,
		logOut: io.MultiWriter(logFile, fw), logFile: logFile, log: log, restart: supervise.RestartPolicy{Restart: spec.Server.Restart, MaxBackoff: supervise.DefaultMaxBackoff},
		hang: spec.Server.HangTimeout, every: every, fatal: fw}, nil
}

// failure is why an incarnation ended: its state, cause and evidence.
type failure struct {
	state    monitor.State
	cause    string
	evidence []string
}

func (f *simFleet) Run(ctx context.Context) error {
	defer f.logFile.Close()
	for {
		f.fatal.reset()
		srv, err := sim.New(f.cfg, f.logOut)
		if err != nil {
			return &FailedError{Cause: "simulator config: " + err.Error()}
		}
		f.set(ctx, monitor.EndpointStatus{URL: f.url, State: monitor.Starting, Restarts: f.restart.Failures()})
		if _, err := srv.Start(ctx, f.addr); err != nil {
			srv.Close()
			if ctx.Err() != nil {
				return nil
			}
			return &FailedError{Cause: "start simulator: " + err.Error()}
		}
		select {
		case <-srv.Ready():
			f.set(ctx, monitor.EndpointStatus{URL: f.url, State: monitor.Ready, Restarts: f.restart.Failures()})
		case code := <-srv.Crashed():
			srv.Close()
			if err := f.down(ctx, f.crashed(code, " during startup")); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			srv.Close()
			return nil
		}
		fail := f.watch(ctx, srv)
		srv.Close()
		if ctx.Err() != nil {
			return nil
		}
		if err := f.down(ctx, fail); err != nil {
			return err
		}
	}
}

// watch blocks until the server crashes or hangs (or ctx ends), probing
// its load meanwhile.
func (f *simFleet) watch(ctx context.Context, srv *sim.Server) failure {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	probeCtx, stopProbes := context.WithCancel(ctx)
	probes := make(chan struct{})
	go func() {
		defer close(probes)
		f.probeLoop(probeCtx)
	}()
	defer func() { stopProbes(); <-probes }()
	for {
		select {
		case <-ctx.Done():
			return failure{}
		case code := <-srv.Crashed():
			return f.crashed(code, "")
		case <-tick.C:
			inFlight, last := f.progressOf(f.url)
			if f.hang > 0 && inFlight > 0 && !last.IsZero() && time.Since(last) > f.hang {
				return failure{state: monitor.Stalled, cause: fmt.Sprintf("no token for %.1fs with %d requests in flight", time.Since(last).Seconds(), inFlight)}
			}
		}
	}
}

// crashed describes an exit: the log's crash signature names the cause
// when there is one (cuda_oom), as for a supervised server.
func (f *simFleet) crashed(code int, when string) failure {
	exit := fmt.Sprintf("exit code %d%s", code, when)
	if c, line := f.fatal.cause(); c != "" {
		return failure{state: monitor.Down, cause: c, evidence: []string{exit, "log: " + line}}
	}
	return failure{state: monitor.Down, cause: exit}
}

// probeLoop reads the simulator's metrics every f.every, as the runner
// reads a launched server's, for the observer.
func (f *simFleet) probeLoop(ctx context.Context) {
	// The simulator in another engine's mode speaks that engine's metrics
	// and routes (a llama.cpp mode's slots, vLLM's names).
	d, _ := engine.SimAs(f.cfg.Engine)
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	f.scrapeLoop(ctx, client, f.url, func() engine.Dialect { return d }, f.every)
}

// down reports the failure and waits out the backoff, or fails the fleet.
func (f *simFleet) down(ctx context.Context, fail failure) error {
	state, cause := fail.state, fail.cause
	f.set(ctx, monitor.EndpointStatus{URL: f.url, State: state, Cause: cause, Evidence: fail.evidence, Restarts: f.restart.Failures()})
	delay, failures, ok := f.restart.Fail(time.Now())
	if !ok {
		ev := []string{fmt.Sprintf("%d failures within %s (restart.max %d)", failures, f.restart.Restart.Window, f.restart.Restart.Max)}
		f.set(ctx, monitor.EndpointStatus{URL: f.url, State: monitor.Failed, Cause: cause, Evidence: ev, Restarts: f.restart.Failures()})
		return &FailedError{Cause: f.url + ": " + cause, Evidence: ev}
	}
	f.set(ctx, monitor.EndpointStatus{URL: f.url, State: monitor.Restarting, Cause: cause,
		Evidence: []string{fmt.Sprintf("restart in %s", delay)}, Restarts: f.restart.Failures()})
	select {
	case <-ctx.Done():
	case <-time.After(delay):
	}
	return nil
}

// fatalWatch is an io.Writer over the simulator's log that keeps the
// highest-priority crash signature of the current incarnation.
type fatalWatch struct {
	mu      sync.Mutex
	partial []byte
	best    string
	line    string
}

func (w *fatalWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		if ev := engine.ParseLogLine(line); ev.Kind == engine.Fatal && engine.CausePriority(ev.Cause) > engine.CausePriority(w.best) {
			w.best, w.line = ev.Cause, strings.TrimSpace(line)
		}
	}
	if len(w.partial) > 1<<16 {
		w.partial = w.partial[:0] // a line this long is no crash signature
	}
	return len(p), nil
}

func (w *fatalWatch) cause() (cause, line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.best, w.line
}

func (w *fatalWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.best, w.line, w.partial = "", "", w.partial[:0]
}
