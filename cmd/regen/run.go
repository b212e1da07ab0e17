package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/runner"
	"github.com/regen-dev/regen/internal/source"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/backend"
	"github.com/regen-dev/regen/internal/ui"
)

func init() { addCommand(newRunCommand) }

type runOptions struct {
	drain    time.Duration
	progress time.Duration
	noExport bool
	verbose  bool
	lanes    []string
	newCfg   bool
	web      webOptions
}

func (o *runOptions) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.drain, "drain-timeout", 30*time.Second, "after the first Ctrl-C, wait this long for in-flight requests before requeueing them")
	fs.DurationVar(&o.progress, "progress-every", 0, "progress refresh period (default 1s on a terminal, 10s otherwise)")
	fs.BoolVar(&o.noExport, "no-export", false, "do not export when the job finishes")
	fs.BoolVar(&o.verbose, "verbose", false, "log debug detail too (the log is .regen/<job>/regen.log beside the job file)")
	fs.BoolVar(&o.newCfg, "new-config", false, "accept a job file that changes what answers would be (model, generation settings, max_tokens, mappings, quality rules): start a new configuration generation and generate every sample again")
	fs.StringSliceVar(&o.lanes, "lanes", nil, "claim only these lanes (comma-separated; default all): workers sharing a PostgreSQL store may split the lanes")
	o.web.AddFlags(fs)
}

func newRunCommand() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run JOB.yaml",
		Short: "Ingest, launch or find the servers, generate every sample exactly once, export",
		Long: `run ingests the job's sources (idempotently), starts the configured server
(the built-in simulator for engine: sim) or uses the listed endpoints, dispatches
every pending sample through its lane, stores each result durably, and exports
the results when every sample is finished.

A re-run resumes: nothing finished is redone, nothing is duplicated. The first
Ctrl-C drains in-flight requests (bounded by --drain-timeout); a second one
exits at once. SIGTERM and SIGHUP (a dropped SSH session; not under nohup)
count as Ctrl-C. Either way, run the same command again to resume.

A re-run whose job file changes what answers would be (model, generation
settings, max_tokens, source mappings, quality rules) is refused before any
request, with the differences field by field; --new-config accepts the change:
a new configuration generation starts and every sample is generated again
(the earlier answers stay in the store's history, not in the export).

With a PostgreSQL store (store.dsn or REGEN_STORE = postgres://...), the same
command on several hosts runs one job together: each worker sends to its own
endpoints, a dead worker's samples go back to the others, and one worker
exports at the end while the others wait for it.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRun(cmd.Context(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// openStoreWaiting opens the job's store, waiting for one that cannot be
// reached yet (a database still starting, restarting, or a network cut):
// a worker started before its database should wait, not fail.
func openStoreWaiting(ctx context.Context, spec *job.Spec) (store.Store, error) {
	return openWaiting(ctx, spec, func() (store.Store, error) { return openStore(ctx, spec) })
}

// openWaiting calls open until it returns a store or an error other than
// an unreachable store.
func openWaiting(ctx context.Context, spec *job.Spec, open func() (store.Store, error)) (store.Store, error) {
	gap := 500 * time.Millisecond
	for {
		st, err := open()
		if err == nil || !backend.Unreachable(err) {
			return st, err
		}
		fmt.Fprintf(os.Stderr, "regen: store of job %s unreachable, retrying in %s: %v\n", spec.Name, gap, err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (interrupted while waiting for the store)", err)
		case <-time.After(gap):
		}
		gap = min(2*gap, 10*time.Second)
	}
}

// checkRun refuses a run that could not finish, before any request: a
// --lanes name the job lacks, a bad --web, a source path matching no file,
// an output folder the export at the end could not write.
func checkRun(spec *job.Spec, o *runOptions) error {
	for _, l := range o.lanes {
		if !slices.ContainsFunc(spec.Lanes, func(jl job.Lane) bool { return jl.Name == l }) {
			return fmt.Errorf("--lanes: job %s has no lane %q", spec.Name, l)
		}
	}
	if err := o.web.resolve(); err != nil {
		return err
	}
	if err := sourcesFound(spec); err != nil {
		return err
	}
	if o.noExport {
		return nil
	}
	return outputProblem(spec)
}

// sourcesFound refuses a job a source path of which matches no file (a
// typo, a folder not mounted), naming the job file's line as validate
// does, before a store is made for a job that cannot ingest.
func sourcesFound(spec *job.Spec) error {
	for i, src := range spec.Sources {
		if _, err := source.Files(src, spec.Dir); err != nil {
			return spec.FieldErrorf(fmt.Sprintf("sources[%d].path", i), "%s", spec.RelText(err.Error()))
		}
	}
	return nil
}

func runRun(ctx context.Context, path string, o runOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	if err := checkRun(spec, &o); err != nil {
		return err
	}
	st, err := openStoreWaiting(ctx, spec)
	if err != nil {
		return err
	}
	defer st.Close()

	terminal := term.IsTerminal(int(os.Stdout.Fd()))
	abort, stopSignals := onSignals(terminal)
	defer stopSignals()

	logFile, log, err := openJobLog(spec, o.verbose)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Printf("regen: job %s, store %s, log %s%s\n", spec.Name, spec.Rel(st.Info().Location), spec.Rel(spec.LogPath()), relNote(spec))
	var metrics *monitor.Metrics
	if o.web.addr != "" {
		o.web.servedBy, o.web.jobFile = "run", path
		stop, m, err := runDashboard(ctx, spec, o.web, log)
		if err != nil {
			return err
		}
		defer stop()
		metrics = m
	}
	every := o.progress
	if every <= 0 && terminal {
		every = time.Second
	}
	// The terminal view subscribes to the runner's frames.
	view := ui.NewProgress(os.Stdout, terminal)
	sum, err := runner.Run(ctx, runner.Options{
		Spec: spec, Store: st, Progress: view.Show, Logger: log,
		ProgressEvery: every, DrainTimeout: o.drain, NoExport: o.noExport, Lanes: o.lanes, Metrics: metrics, NewConfig: o.newCfg,
		Version: versionString(), Abort: abort, Capture: captureStage(spec, st, log),
	})
	// A job that finished with nothing done prints its summary, then fails.
	var none *runner.NothingDoneError
	if err != nil && !errors.As(err, &none) {
		return runFailure(err)
	}
	printRunSummary(spec, sum)
	return err // nil, or the NothingDoneError: exit 1
}

// captureStage is the job's capture as the runner calls it, nil for a
// job without one.
func captureStage(spec *job.Spec, st store.Store, log *slog.Logger) func(context.Context) (string, error) {
	if spec.Capture == nil {
		return nil
	}
	return func(ctx context.Context) (string, error) { return captureJob(ctx, spec, st, log) }
}

// openJobLog opens the job's log file, where logs go: the terminal shows
// the progress view, where state changes appear as they happen.
func openJobLog(spec *job.Spec, verbose bool) (*os.File, *slog.Logger, error) {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	if err := os.MkdirAll(spec.StateDir(), 0o755); err != nil {
		return nil, nil, fmt.Errorf("create %s: %w", spec.StateDir(), err)
	}
	f, err := os.OpenFile(spec.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open log: %w", err)
	}
	log := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: level})).With("job", spec.Name, "pid", os.Getpid())
	return f, log, nil
}

// runFailure gives a failed run its exit code: 3 for a job that failed
// (its evidence printed), 130 for an interrupted one.
func runFailure(err error) error {
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

// printRunSummary prints the counts, the output files and their warnings.
func printRunSummary(spec *job.Spec, sum runner.Summary) {
	t := sum.Final.Total
	fmt.Printf("regen: job %s done: %d samples (%d done, %d rejected, %d dead), %d bad source rows\n",
		spec.Name, t.Total, t.Done, t.Rejected, t.Dead, sum.Final.IngestErrors)
	for _, f := range sum.Export.Files {
		fmt.Printf("output: %-20s %12s  %s\n", f.Format, rowsText(f), spec.Rel(f.Path))
	}
	writeExportNotes(os.Stdout, spec, sum.Export)
	writeTokenSummary(os.Stdout, spec, sum.Export)
}

// relNote says which folder the paths regen prints are relative to, when it
// is not the working directory.
func relNote(spec *job.Spec) string {
	if wd, err := os.Getwd(); err == nil && wd == spec.Dir {
		return ""
	}
	return " (paths relative to " + filepath.Dir(spec.Path) + string(filepath.Separator) + ")"
}

// runDashboard serves the dashboard beside a run. It reads through a store
// handle of its own, so a slow page never holds the connection the runner
// writes results through.
func runDashboard(ctx context.Context, spec *job.Spec, o webOptions, log *slog.Logger) (stop func(), m *monitor.Metrics, err error) {
	st, err := openStore(ctx, spec)
	if err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	m = monitor.NewMetrics(reportFunc(spec, st))
	stopWeb, _, err := startDashboard(spec, st, o, m, os.Stdout, log)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return func() { stopWeb(); st.Close() }, m, nil
}

// onSignals handles the interrupts of a run. The first is the context's
// (main cancels it: the runner drains). A second exits at once, once the
// runner has released its leases and written its last heartbeat (STOPPED,
// not DEAD; bounded by the runner's abort budget); nothing is lost either
// way. On a terminal the runner's view prints the draining line itself,
// above its frame, where a line written here would be drawn over.
func onSignals(terminal bool) (abort chan chan struct{}, stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, stopSignals()...)
	abort = make(chan chan struct{}, 1)
	go func() {
		<-sigs
		if !terminal {
			fmt.Fprintln(os.Stderr, "regen: draining in-flight requests; press Ctrl-C again to exit now")
		}
		<-sigs
		ack := make(chan struct{})
		abort <- ack
		select {
		case <-ack:
		case <-time.After(5 * time.Second):
		}
		fmt.Fprintln(os.Stderr, "\nregen: exiting now; re-run to resume")
		os.Exit(130)
	}()
	return abort, func() { signal.Stop(sigs) }
}
