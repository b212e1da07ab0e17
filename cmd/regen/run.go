package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/runner"
)

func init() { addCommand(newRunCommand) }

type runOptions struct {
	drain    time.Duration
	progress time.Duration
	noExport bool
	verbose  bool
	web      webOptions
}

func (o *runOptions) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.drain, "drain-timeout", 30*time.Second, "after the first Ctrl-C, wait this long for in-flight requests before requeueing them")
	fs.DurationVar(&o.progress, "progress-every", 0, "progress refresh period (default 1s on a terminal, 10s otherwise)")
	fs.BoolVar(&o.noExport, "no-export", false, "do not export when the job finishes")
	fs.BoolVar(&o.verbose, "verbose", false, "log debug detail to stderr")
	o.web.AddFlags(fs)
}

func newRunCommand() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run job.yaml",
		Short: "Ingest, launch or find the servers, generate every sample exactly once, export",
		Long: `run ingests the job's sources (idempotently), starts the configured server
(the built-in simulator for engine: sim) or uses the listed endpoints, dispatches
every pending sample through its lane, stores each result durably, and exports
the results when every sample is finished.

A re-run resumes: nothing finished is redone, nothing is duplicated. The first
Ctrl-C drains in-flight requests (bounded by --drain-timeout); a second one
exits at once. Either way, run the same command again to resume.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRun(cmd.Context(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runRun(ctx context.Context, path string, o runOptions) error {
	spec, err := job.Load(path)
	if err != nil {
		return err
	}
	if err := o.web.resolve(); err != nil {
		return err
	}
	st, err := openStore(spec)
	if err != nil {
		return err
	}
	defer st.Close()

	// A second interrupt exits at once; the store's leases are released by
	// the next run, so nothing is lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		<-sigs
		fmt.Fprintln(os.Stderr, "\nregen: draining in-flight requests; press Ctrl-C again to exit now")
		<-sigs
		fmt.Fprintln(os.Stderr, "regen: exiting now; re-run to resume")
		os.Exit(130)
	}()

	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("job", spec.Name)
	terminal := term.IsTerminal(int(os.Stdout.Fd()))
	fmt.Printf("regen: job %s, store %s\n", spec.Name, spec.Store.DSN)
	var metrics *monitor.Metrics
	if o.web.addr != "" {
		stop, m, err := runDashboard(spec, o.web, log)
		if err != nil {
			return err
		}
		defer stop()
		metrics = m
	}
	sum, err := runner.Run(ctx, runner.Options{
		Spec: spec, Store: st, Out: os.Stdout, Terminal: terminal, Logger: log,
		ProgressEvery: o.progress, DrainTimeout: o.drain, NoExport: o.noExport, Metrics: metrics,
	})
	if err != nil {
		var failed *runner.FailedError
		if errors.As(err, &failed) {
			for _, e := range failed.Evidence {
				fmt.Fprintln(os.Stderr, "  evidence:", e)
			}
			return &exitError{code: 3, err: err}
		}
		if errors.Is(err, runner.ErrInterrupted) {
			return &exitError{code: 130, err: err}
		}
		return err
	}
	t := sum.Final.Total
	fmt.Printf("regen: job %s done: %d samples (%d done, %d rejected, %d dead), %d bad source rows\n",
		spec.Name, t.Total, t.Done, t.Rejected, t.Dead, sum.Final.IngestErrors)
	for _, f := range sum.Export.Files {
		rel := f.Path
		if wd, werr := os.Getwd(); werr == nil {
			if r, rerr := filepath.Rel(wd, f.Path); rerr == nil {
				rel = r
			}
		}
		fmt.Printf("output: %-20s %7d rows  %s\n", f.Format, f.Rows, rel)
	}
	return nil
}

// runDashboard serves the dashboard beside a run. It reads through a store
// handle of its own, so a slow page never holds the connection the runner
// writes results through.
func runDashboard(spec *job.Spec, o webOptions, log *slog.Logger) (stop func(), m *monitor.Metrics, err error) {
	st, err := openStore(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	m = monitor.NewMetrics(reportFunc(spec, st))
	stopWeb, err := startDashboard(spec, st, o, m, os.Stdout, log)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return func() { stopWeb(); st.Close() }, m, nil
}
