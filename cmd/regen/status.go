package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/backend"
	"github.com/regen-dev/regen/internal/ui"
)

func init() { addCommand(newStatusCommand) }

type statusOptions struct {
	json        bool
	waitHealthy time.Duration
	host        string
}

func (o *statusOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	fs.DurationVar(&o.waitHealthy, "wait-healthy", 0, "wait up to this long for real token progress; exit non-zero if none comes (e.g. 60s)")
	fs.StringVar(&o.host, "host", "", "judge only the workers on this host (a node's liveness check of a shared job); exit 2 when none of them is alive")
}

func newStatusCommand() *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status JOB.yaml",
		Short: "One screen of truth about a job, from its store alone",
		Long: `status reads the job's store and says RUNNING, DRAINING, STALLED, DOWN,
RESTARTING, DONE, STOPPED, FAILED or DEAD with the evidence. It works whether the runner is
alive or not: a heartbeat older than the job's monitor.dead_after is DEAD.

Exit codes: 0 running, draining or done, 1 stalled, down or restarting, 2 dead, stopped or failed.

With a shared (PostgreSQL) store, status lists every worker and judges the
job across them; --host narrows the verdict to the workers on one host, for
a per-node liveness probe.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runStatus(ctx context.Context, out io.Writer, path string, o statusOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	st, err := openExisting(ctx, spec, "it was never run")
	switch {
	case errors.Is(err, store.ErrNoStore):
		return &exitError{code: 2, err: err}
	case backend.Unreachable(err):
		// The store itself is down: that is the job's state, with the
		// store as the subject and the cause as evidence.
		return printReport(out, spec, monitor.StoreDown(spec.Name, time.Now(), err), o.json)
	case err != nil:
		return err
	}
	defer st.Close()
	host, _ := os.Hostname()
	if o.waitHealthy > 0 {
		report := reportFunc(spec, st)
		return waitHealthy(ctx, out, st, spec, o.waitHealthy, func() (monitor.Report, error) { return report(ctx) })
	}
	return writeStatusFor(ctx, out, spec, st, time.Now(), host, o.json, o.host)
}

// assess is the job's status report as of now: what `regen status` prints
// and the dashboard and `regen watch` show. A store that stops answering
// makes the report DOWN with the store as the subject.
func assess(ctx context.Context, spec *job.Spec, st store.Store, now time.Time, host string) (monitor.Report, error) {
	r, err := monitor.Assess(ctx, st, monitor.AssessOptions{Job: spec.Name, Now: now, DeadAfter: spec.Monitor.DeadAfter, Host: host,
		StoreNotes: monitor.ReadStoreNotes(spec.StateDir())})
	if backend.Unreachable(err) {
		return monitor.StoreDown(spec.Name, now, err), nil
	}
	r.RejectedFile = spec.Rel(export.RejectedFile(spec.Output.Dir, spec.BaseName()))
	r.RejectedExported = export.ExportedRejects(spec.Output.Dir, spec.BaseName(), r.Generations)
	if err == nil && spec.Capture != nil {
		if r.Capture, err = monitor.ReadCapture(ctx, st); backend.Unreachable(err) {
			return monitor.StoreDown(spec.Name, now, err), nil
		}
	}
	return r, err
}

// writeStatus prints the report as of now, as text or JSON, and returns the
// state's exit code as an *exitError when it is not 0.
func writeStatus(ctx context.Context, out io.Writer, spec *job.Spec, st store.Store, now time.Time, host string, asJSON bool) error {
	return writeStatusFor(ctx, out, spec, st, now, host, asJSON, "")
}

// writeStatusFor is writeStatus judging only the workers on onlyHost when
// it is set.
func writeStatusFor(ctx context.Context, out io.Writer, spec *job.Spec, st store.Store, now time.Time, host string, asJSON bool, onlyHost string) error {
	r, err := assess(ctx, spec, st, now, host)
	if err != nil {
		return err
	}
	if onlyHost != "" && r.Store == nil {
		r = monitor.ForHost(r, onlyHost)
	}
	return printReport(out, spec, r, asJSON)
}

// printReport writes r as text or JSON and maps its state to the exit code.
func printReport(out io.Writer, spec *job.Spec, r monitor.Report, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		fmt.Fprint(out, ui.StatusText(spec.Name, r))
	}
	if r.ExitCode != 0 {
		return &exitError{code: r.ExitCode}
	}
	return nil
}

// waitHealthy waits for the runner's streamed-token counter to move while the
// job is RUNNING; anything else at the deadline fails loudly with the evidence.
func waitHealthy(ctx context.Context, out io.Writer, st store.Store, spec *job.Spec, limit time.Duration, assess func() (monitor.Report, error)) error {
	deadline := time.Now().Add(limit)
	first := int64(-1)
	var last monitor.Report
	for {
		r, err := assess()
		if err != nil {
			return err
		}
		last = r
		if r.State == monitor.Done {
			fmt.Fprintf(out, "job %s: DONE\n", spec.Name)
			return nil
		}
		hb, ok, err := st.LastHeartbeat(ctx)
		if err != nil {
			return err
		}
		if ok && r.State == monitor.Running {
			var b monitor.Beat
			if json.Unmarshal(hb.Counters, &b) == nil {
				if first < 0 {
					first = b.Tokens
				} else if b.Tokens > first {
					fmt.Fprintf(out, "job %s: healthy: %d tokens streamed in the last %s\n", spec.Name, b.Tokens-first, time.Since(deadline.Add(-limit)).Round(time.Second))
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	fmt.Fprint(out, ui.StatusText(spec.Name, last))
	code := last.ExitCode
	if code == 0 {
		code = 1
	}
	return &exitError{code: code, err: fmt.Errorf("job %s: no token progress within %s (state %s)", spec.Name, limit, last.State)}
}
