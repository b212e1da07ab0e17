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

	"github.com/regen-dev/regen/internal/capture"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

func init() { addCommand(newCaptureCommand) }

type captureOptions struct {
	verbose   bool
	progress  time.Duration
	retryDead bool
	recheck   bool
}

func (o *captureOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.verbose, "verbose", false, "log debug detail too (the log is .regen/<job>/regen.log beside the job file)")
	fs.DurationVar(&o.progress, "progress-every", 10*time.Second, "print the capture's counts this often (0: only at the end)")
	fs.BoolVar(&o.retryDead, "retry-dead", false, "return the dead captures to pending with their attempts reset, then capture them again")
	fs.BoolVar(&o.recheck, "recheck", false, "hash every captured file first and capture again each one missing or changed since it was recorded (what regen verify reports)")
}

func newCaptureCommand() *cobra.Command {
	var o captureOptions
	cmd := &cobra.Command{
		Use:   "capture JOB.yaml",
		Short: "Capture the target model's hidden states of every done sample, exactly once",
		Long: `capture sends every done sample's exact token ids (each turn row's with
output.token_rows: turn) to the job's capture servers (capture.endpoints: vLLM
with the extract_hidden_states method and a hidden-states connector), checks
each file the server writes, moves it into capture.dir under a stable name
and records its size and sha256 in the store. regen run does the same after
generation; capture runs it alone, e.g. once the capture servers are up.

A re-run resumes: nothing captured is sent again, nothing is listed twice.
It exits 1 when a capture failed for good (a bad file, capture.max_attempts
times: the first one is named; --retry-dead tries those again) or every
capture server stayed down for capture.down_after. --recheck captures again
the files regen verify finds missing or changed.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCapture(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runCapture(ctx context.Context, out io.Writer, path string, o captureOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	if spec.Capture == nil {
		return fmt.Errorf("%s: job %s has no capture: section (see examples/job.example.yaml)", spec.Path, spec.Name)
	}
	st, err := openWaiting(ctx, spec, func() (store.Store, error) {
		return openExisting(ctx, spec, "run it first (regen run "+spec.Rel(spec.Path)+")")
	})
	if err != nil {
		return err
	}
	defer st.Close()
	logFile, log, err := openJobLog(spec, o.verbose)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Fprintf(out, "regen: capture of job %s into %s%s\n", spec.Name, spec.Rel(spec.Capture.Dir), relNote(spec))
	if err := requeueCaptures(ctx, out, spec, st, o); err != nil {
		return err
	}
	stop := captureProgress(ctx, out, st, o.progress)
	line, err := captureJob(ctx, spec, st, log)
	stop()
	fmt.Fprintln(out, line)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return &exitError{code: 130, err: errors.New("capture interrupted; re-run to resume")}
	}
	return err
}

// requeueCaptures returns to pending what --retry-dead and --recheck ask
// for, saying how many.
func requeueCaptures(ctx context.Context, out io.Writer, spec *job.Spec, st store.Store, o captureOptions) error {
	if o.retryDead {
		n, err := st.RequeueDeadCaptures(ctx, "")
		if err != nil {
			return fmt.Errorf("capture --retry-dead: %w", err)
		}
		fmt.Fprintf(out, "capture: %d dead captures returned to pending\n", n)
	}
	if o.recheck {
		host, _ := os.Hostname()
		bad, err := capture.Recheck(ctx, st, spec.Dir, fmt.Sprintf("recheck-%s-%d", host, os.Getpid()))
		if err != nil {
			return fmt.Errorf("capture --recheck: %w", err)
		}
		for _, p := range bad {
			fmt.Fprintln(out, p.String())
		}
		fmt.Fprintf(out, "capture: %d captured files missing or changed, to capture again\n", len(bad))
	}
	return nil
}

// captureJob runs the job's capture and says what it did; regen run has
// its runner call it once generation is finished, before the export.
func captureJob(ctx context.Context, spec *job.Spec, st store.Store, log *slog.Logger) (string, error) {
	sum, err := capture.RunJob(ctx, spec, st, log)
	line := fmt.Sprintf("capture: %d rows with token ids: %d captured now, %d recovered after a kill, %d before, %d dead; %d rows without ids; %s written to %s",
		sum.Rows, sum.Captured, sum.Adopted, sum.Before, sum.Dead, sum.NoIDs, monitor.Size(sum.Bytes), spec.Rel(spec.Capture.Dir))
	if sum.Retried+sum.ServerErrors+sum.LeasesLost+sum.SetAside > 0 {
		line += fmt.Sprintf(" (%d bad files retried, %d server errors, %d leases taken over, %d stale files at a key's name replaced)",
			sum.Retried, sum.ServerErrors, sum.LeasesLost, sum.SetAside)
	}
	if sum.ServerLeftovers > 0 {
		line += fmt.Sprintf("; %d files and locks an interrupted attempt left in the server's folder removed", sum.ServerLeftovers)
	}
	switch {
	case errors.Is(err, capture.ErrIncomplete):
		err = fmt.Errorf("capture: %w; regen capture --retry-dead %s tries the dead ones again", err, spec.Rel(spec.Path))
	case err != nil && !errors.Is(err, context.Canceled):
		err = fmt.Errorf("capture: %w", err)
	}
	return line, err
}

// captureProgress prints the store's capture counts every period until
// stop; the total is the one the capture's walk recorded.
func captureProgress(ctx context.Context, out io.Writer, st store.Store, every time.Duration) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			c, err := st.CaptureCounts(ctx)
			if err != nil {
				continue
			}
			total := "?"
			if v, ok, err := st.Meta(ctx, monitor.CaptureRowsMeta); err == nil && ok {
				total = v
			}
			fmt.Fprintf(out, "capture: %d of %s captured, %d dead, %d in flight, %d to retry; %s\n",
				c.Captured, total, c.Dead, c.Leased, c.Pending, monitor.Size(c.Bytes))
		}
	}()
	return func() { cancel(); <-done }
}
