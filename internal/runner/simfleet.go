package runner

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

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
	log     *slog.Logger
	restart supervise.RestartPolicy
	hang    time.Duration
}

func newSimFleet(spec *job.Spec, logDir string, log *slog.Logger, onState stateFunc) (*simFleet, error) {
	cfg := sim.DefaultConfig()
	if spec.Model != "" {
		cfg.ModelName = spec.Model
	}
	if err := cfg.Apply(spec.Server.Sim); err != nil {
		return nil, fmt.Errorf("%s: server.sim: %w", spec.Path, err)
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
	return &simFleet{statusBoard: newStatusBoard([]string{url}, onState), cfg: cfg, addr: addr, url: url,
		logOut: logFile, log: log, restart: supervise.RestartPolicy{Restart: spec.Server.Restart, MaxBackoff: supervise.DefaultMaxBackoff}, hang: spec.Server.HangTimeout}, nil
}

func (f *simFleet) Run(ctx context.Context) error {
	defer func() {
		if c, ok := f.logOut.(io.Closer); ok {
			c.Close()
		}
	}()
	for {
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
			if err := f.down(ctx, monitor.Down, fmt.Sprintf("exit code %d during startup", code)); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			srv.Close()
			return nil
		}
		cause, state := f.watch(ctx, srv)
		srv.Close()
		if ctx.Err() != nil {
			return nil
		}
		if err := f.down(ctx, state, cause); err != nil {
			return err
		}
	}
}

// watch blocks until the server crashes or hangs (or ctx ends).
func (f *simFleet) watch(ctx context.Context, srv *sim.Server) (cause string, state monitor.State) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", ""
		case code := <-srv.Crashed():
			return fmt.Sprintf("exit code %d", code), monitor.Down
		case <-tick.C:
			inFlight, last := f.progressOf(f.url)
			if f.hang > 0 && inFlight > 0 && !last.IsZero() && time.Since(last) > f.hang {
				return fmt.Sprintf("no token for %.1fs with %d requests in flight", time.Since(last).Seconds(), inFlight), monitor.Stalled
			}
		}
	}
}

// down reports the failure and waits out the backoff, or fails the fleet.
func (f *simFleet) down(ctx context.Context, state monitor.State, cause string) error {
	f.set(ctx, monitor.EndpointStatus{URL: f.url, State: state, Cause: cause, Restarts: f.restart.Failures()})
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
