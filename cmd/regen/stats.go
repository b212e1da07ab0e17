package main

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/ui"
)

func init() { addCommand(newStatsCommand) }

type statsOptions struct {
	json bool
}

func (o *statsOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print the statistics as JSON (versioned: see its \"version\" field)")
}

func newStatsCommand() *cobra.Command {
	var o statsOptions
	cmd := &cobra.Command{
		Use:   "stats JOB.yaml [--json]",
		Short: "Dataset statistics: lengths, truncation, rejects, reasoning, throughput",
		Long: `stats reads the job's store and shows, per partition and lane, the samples and
the answers stored (one per regenerated turn), exact prompt and completion
token percentiles (p50/p90/p99/max), truncation and reject rates,
conversations ended early, the share of reasoning tokens, rejects per rule,
tokens per second over the job's life, and the duplicate ids and bad rows
found at ingest. It reads aggregates the store keeps with every answer, so
it answers at once whatever the job's size, and works while the job runs.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStats(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runStats(ctx context.Context, out io.Writer, path string, o statsOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	st, err := openExisting(ctx, spec, "run it first")
	if err != nil {
		return err
	}
	defer st.Close()
	r, err := stats.Compute(ctx, st, spec.Name, time.Now())
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return ui.WriteStats(out, r)
}
