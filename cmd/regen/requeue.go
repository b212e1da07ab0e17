package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/job"
)

func init() { addCommand(newRequeueCommand) }

type requeueOptions struct {
	reason string
}

func (o *requeueOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.reason, "reason", "", "only dead samples whose error contains this text (default: every dead sample)")
}

func newRequeueCommand() *cobra.Command {
	var o requeueOptions
	cmd := &cobra.Command{
		Use:   "requeue JOB.yaml [--reason TEXT]",
		Short: "Return dead-lettered samples to pending once their cause is fixed",
		Long: `requeue moves dead samples (bad requests, exhausted retries) back to pending
with their attempts reset, for when the cause was the setup rather than the
sample: a parameter the server rejected, a server bug since fixed. Run
` + "`regen run`" + ` again (or let a running one pick them up) to generate them.
Bad source rows are not samples and are not affected.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRequeue(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runRequeue(ctx context.Context, out io.Writer, path string, o requeueOptions) error {
	spec, err := job.Load(path)
	if err != nil {
		return err
	}
	if _, err := os.Stat(storePath(spec)); err != nil {
		return fmt.Errorf("job %s has no store yet (%s): nothing to requeue", spec.Name, spec.Store.DSN)
	}
	st, err := openStore(spec)
	if err != nil {
		return err
	}
	defer st.Close()
	n, err := st.RequeueDead(ctx, o.reason)
	if err != nil {
		return err
	}
	if n == 0 {
		if o.reason != "" {
			fmt.Fprintf(out, "job %s has no dead samples whose error contains %q\n", spec.Name, o.reason)
		} else {
			fmt.Fprintf(out, "job %s has no dead samples to requeue\n", spec.Name)
		}
		return nil
	}
	fmt.Fprintf(out, "requeued %d dead samples of job %s; run `regen run %s` to generate them\n", n, spec.Name, path)
	return nil
}
