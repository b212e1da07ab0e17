package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/ui"
)

func init() { addCommand(newWatchCommand) }

type watchOptions struct {
	web   webOptions
	every time.Duration
}

func (o *watchOptions) AddFlags(fs *pflag.FlagSet) {
	o.web.AddFlags(fs)
	fs.DurationVar(&o.every, "every", 0, "refresh period (default 500ms on a terminal, 10s otherwise)")
}

func newWatchCommand() *cobra.Command {
	var o watchOptions
	cmd := &cobra.Command{
		Use:   "watch job.yaml",
		Short: "Watch a job live: a full-screen terminal view, and optionally the web dashboard",
		Long: `watch reads the job's store alone, so it works from another shell or
another host while the runner runs, and after it died. On a terminal it
shows the job state with its evidence, progress bars per partition and lane,
tokens/s and requests/s over the last hour, each endpoint's state, in-flight
requests, KV cache usage and queue, the last events and the ETA. Keys: tab
switches panes, q quits. Without a terminal it prints what regen status
prints, every --every.

With --web it also serves the dashboard and regen's metrics (/metrics) on
that address. A non-loopback address needs --token (or REGEN_WEB_TOKEN).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWatch(cmd.Context(), os.Stdin, cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// watchEvents is how many events the view reads, for a tall terminal.
const watchEvents = 60

func runWatch(ctx context.Context, in *os.File, out io.Writer, path string, o watchOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	if err := o.web.resolve(); err != nil {
		return err
	}
	st, err := openWaiting(ctx, spec, func() (store.Store, error) { return openExisting(ctx, spec, "it was never run") })
	if errors.Is(err, store.ErrNoStore) {
		st, err = waitForRunner(ctx, spec, path, os.Stderr, err, 500*time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer st.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("job", spec.Name)
	var dashboard string
	if o.web.addr != "" {
		o.web.servedBy, o.web.jobFile = "watch", path
		stop, url, err := startDashboard(spec, st, o.web, nil, os.Stderr, log)
		if err != nil {
			return err
		}
		defer stop()
		// The full-screen view hides what was printed before it: it shows
		// the address itself, and it is printed again when the view ends.
		dashboard = url + " (metrics at /metrics)"
		defer fmt.Fprintf(os.Stderr, "regen: the dashboard at %s ended with this watch\n", url)
	}
	report := reportFunc(spec, st)
	f, isFile := out.(*os.File)
	if isFile && term.IsTerminal(int(f.Fd())) && term.IsTerminal(int(in.Fd())) {
		every := o.every
		if every <= 0 {
			every = 500 * time.Millisecond
		}
		return ui.RunWatch(ctx, in, out, every, watchSnapshots(spec, st, report, dashboard))
	}
	every := o.every
	if every <= 0 {
		every = 10 * time.Second
	}
	return printStatusEvery(ctx, out, spec.Name, report, every)
}

// waitForRunner waits, polling every gap, for the first `regen run` of a
// job that has none yet (noStore says so) to create its store, and says
// that it waits: watch started before run is not an error. Interrupted, it
// exits 2 with noStore, as status does.
func waitForRunner(ctx context.Context, spec *job.Spec, path string, msgs io.Writer, noStore error, gap time.Duration) (store.Store, error) {
	fmt.Fprintf(msgs, "regen: %v\nregen: waiting for a runner to start it (`regen run %s`); Ctrl-C to stop\n", noStore, path)
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil, &exitError{code: 2, err: noStore}
		case <-time.After(gap):
		}
		st, err := openExisting(ctx, spec, "it was never run")
		switch {
		case err == nil:
			fmt.Fprintf(msgs, "regen: job %s has a store now; watching\n", spec.Name)
			return st, nil
		case errors.Is(err, store.ErrNoStore):
		case failures < 10: // a store being created may not open at once
			failures++
		default:
			return nil, err
		}
	}
}

// watchSnapshots reads what the full-screen view draws: the report, the
// history on the job's axis and the newest events.
func watchSnapshots(spec *job.Spec, st store.Store, report func(context.Context) (monitor.Report, error), dashboard string) func(context.Context) (ui.WatchSnapshot, error) {
	return func(ctx context.Context) (ui.WatchSnapshot, error) {
		r, err := report(ctx)
		if err != nil {
			return ui.WatchSnapshot{}, err
		}
		now := time.Now()
		// The report already chose the run the charts are over.
		var span monitor.RunSpan
		if r.RatesRun != nil {
			span = *r.RatesRun
		}
		h, err := monitor.ReadHistory(ctx, st, monitor.JobAxis(span, r.RatesRun != nil, now, 0), now)
		if err != nil {
			return ui.WatchSnapshot{}, err
		}
		// More events than the report's five: a tall terminal shows them.
		evs, err := st.Events(ctx, watchEvents)
		if err != nil {
			return ui.WatchSnapshot{}, err
		}
		events := make([]monitor.Event, 0, len(evs))
		for _, e := range evs {
			events = append(events, monitor.EventOf(e))
		}
		return ui.WatchSnapshot{Job: spec.Name, Now: now, Report: r, History: h, Events: events, Dashboard: dashboard}, nil
	}
}

// printStatusEvery prints the status text every period until ctx ends,
// for output that is not a terminal.
func printStatusEvery(ctx context.Context, out io.Writer, name string, report func(context.Context) (monitor.Report, error), every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r, err := report(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fmt.Fprintf(out, "%s regen watch: cannot read the store: %v\n\n", time.Now().Format("15:04:05"), err)
		default:
			fmt.Fprintf(out, "%s\n%s\n", time.Now().Format(time.RFC3339), ui.StatusText(name, r))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
