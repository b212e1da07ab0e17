package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/supervise"
)

// supervisedFleet is one server process regen launched and keeps alive.
type supervisedFleet struct {
	*statusBoard
	sup *supervise.Supervisor
	log *slog.Logger
	// What the metrics of the server are read with, and how often.
	dialect engine.Dialect
	every   time.Duration
	// events carries the supervisor's state changes to Run's goroutine, which
	// owns the context used for store writes and alerts.
	ctx context.Context
}

func newSupervisedFleet(spec *job.Spec, logDir string, log *slog.Logger, onState stateFunc) (*supervisedFleet, error) {
	f := &supervisedFleet{log: log, every: probeEvery(spec)}
	f.dialect = serverDialect(*spec.Server)
	sup, err := supervise.New(supervise.Config{
		Dialect: f.dialect,
		Server:  *spec.Server,
		Model:   spec.Model,
		LogPath: filepath.Join(logDir, "server.log"),
		Logger:  log,
		OnState: f.onState,
		Progress: func() (int, time.Time) {
			return f.progressOf(f.sup.URL())
		},
		ProbeEvery: spec.Monitor.ProbeEvery,
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	f.sup = sup
	f.statusBoard = newStatusBoard([]string{sup.URL()}, onState)
	return f, nil
}

func (f *supervisedFleet) onState(st supervise.Status) {
	ctx := f.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	f.set(ctx, monitor.EndpointStatus{URL: st.URL, State: st.State, Since: st.Since,
		Cause: st.Cause, Evidence: st.Evidence, Restarts: st.Restarts})
}

func (f *supervisedFleet) Run(ctx context.Context) error {
	f.ctx = context.WithoutCancel(ctx)
	scrapeCtx, stopScrapes := context.WithCancel(ctx)
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		client := &http.Client{}
		defer client.CloseIdleConnections()
		f.scrapeLoop(scrapeCtx, client, f.sup.URL(), func() engine.Dialect { return f.dialect }, f.every)
	}()
	err := f.sup.Run(ctx)
	stopScrapes()
	<-scraped
	var failed *supervise.FailedError
	if errors.As(err, &failed) {
		// The restart count goes first: it says why regen gave up.
		ev := append([]string{fmt.Sprintf("%d failures within %s, the limit of server.restart", failed.Failures, failed.Window)}, failed.Evidence...)
		return &FailedError{Cause: f.sup.URL() + ": " + failed.Cause, Evidence: ev}
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}
