package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
)

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
	cfg.fill()
	s := &Supervisor{cfg: cfg, server: cfg.Server, restart: cfg.Server.Restart}
	s.applyDefaults()
	if s.server.Port == 0 {
		port, err := freePort(s.server.Host)
		if err != nil {
			return nil, fmt.Errorf("supervise: pick a port: %w", err)
		}
		s.server.Port = port
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

// applyDefaults gives the restart policy and the server the defaults the job left
// zero.
func (s *Supervisor) applyDefaults() {
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
	if s.server.ReadyTimeout <= 0 {
		s.server.ReadyTimeout = DefaultReadyTimeout
	}
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

// exitLogWait bounds the wait for the log's last lines after the leader
// exited.
const exitLogWait = 500 * time.Millisecond

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
