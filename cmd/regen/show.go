package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/review"
)

func init() { addCommand(newShowCommand) }

type showOptions struct {
	json bool
}

func (o *showOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print the sample as JSON (the document the dashboard's /api/samples/ID serves under \"review\")")
}

func newShowCommand() *cobra.Command {
	var o showOptions
	cmd := &cobra.Command{
		Use:   "show JOB.yaml ID [--json]",
		Short: "One sample, turn by turn: the dataset's answer beside the regenerated one",
		Long: `show prints one sample as the dashboard's sample page does: every turn's
input, the dataset's own answer beside the regenerated one (reasoning, tool
calls, and the tool results that followed), each answer's lane, attempts,
finish reason, usage and endpoint, and why the conversation ended early,
was rejected (rule and evidence) or dead-lettered. It reads the store and
works while the job runs.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("want a job file and a sample id, got %d arguments (usage: %s %s)", len(args), cmd.Parent().CommandPath(), cmd.Use)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runShow(cmd.Context(), cmd.OutOrStdout(), args[0], args[1], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runShow(ctx context.Context, out io.Writer, path, id string, o showOptions) error {
	spec, err := job.Load(path)
	if err != nil {
		return err
	}
	st, err := openExisting(ctx, spec, "run it first")
	if err != nil {
		return err
	}
	defer st.Close()
	row, ok, err := st.Sample(ctx, id)
	if err != nil {
		return fmt.Errorf("read sample %s: %w", id, err)
	}
	if !ok {
		hint := ""
		if !strings.Contains(id, "/") {
			hint = " (ids are <partition>/<key>)"
		}
		return fmt.Errorf("no sample with id %q in job %s%s", id, spec.Name, hint)
	}
	row.Origin = spec.Rel(row.Origin)
	s, err := review.Of(row)
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(s)
	}
	return review.Write(out, s)
}
