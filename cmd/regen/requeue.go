package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/quality"
)

func init() { addCommand(newRequeueCommand) }

type requeueOptions struct {
	reason   string
	rejected bool
	rule     string
}

func (o *requeueOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.reason, "reason", "", "only dead samples whose error contains this text (default: every dead sample)")
	fs.BoolVar(&o.rejected, "rejected", false, "requeue rejected samples (refused by a quality rule) instead of dead ones")
	fs.StringVar(&o.rule, "rule", "", "with --rejected: only samples rejected by this rule ("+strings.Join(quality.RuleNames, ", ")+")")
}

func newRequeueCommand() *cobra.Command {
	var o requeueOptions
	cmd := &cobra.Command{
		Use:   "requeue JOB.yaml [--reason TEXT | --rejected [--rule R]]",
		Short: "Return dead-lettered or rejected samples to pending",
		Long: `requeue moves dead samples (bad requests, exhausted retries) back to pending
with their attempts reset, for when the cause was the setup rather than the
sample: a parameter the server rejected, a server bug since fixed.

With --rejected it moves samples a quality rule rejected (all, or those of
--rule) back to pending instead: the refused answer is dropped and the
turn it answered is generated again (earlier turns of a multi-turn sample
are kept), for instance after changing the temperature or a rule.

Run ` + "`regen run`" + ` again (or let a running one pick them up) to generate them.
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
	switch {
	case o.rejected && o.reason != "":
		return fmt.Errorf("--reason selects dead samples and --rejected rejected ones: use one")
	case o.rule != "" && !o.rejected:
		return fmt.Errorf("--rule needs --rejected")
	case o.rule != "" && !slices.Contains(quality.RuleNames, o.rule):
		return fmt.Errorf("--rule %q: unknown rule (want %s)", o.rule, strings.Join(quality.RuleNames, ", "))
	}
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	st, err := openExisting(ctx, spec, "nothing to requeue")
	if err != nil {
		return err
	}
	defer st.Close()
	if o.rejected {
		n, err := st.RequeueRejected(ctx, o.rule)
		if err != nil {
			return err
		}
		what := "rejected samples"
		if o.rule != "" {
			what = "samples rejected by " + o.rule
		}
		if n == 0 {
			fmt.Fprintf(out, "job %s has no %s to requeue\n", spec.Name, what)
			return nil
		}
		fmt.Fprintf(out, "requeued %d %s of job %s; run `regen run %s` to generate them again\n", n, what, spec.Name, path)
		return nil
	}
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
