package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
)

func init() { addCommand(newExportCommand) }

type exportOptions struct {
	formats  []string
	out      string
	metadata string
}

func (o *exportOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&o.formats, "format", nil, "sharegpt, openai-batch or parquet; repeat or comma-separate (default: the job's output.formats)")
	fs.StringVar(&o.out, "out", "", "output directory (default: the job's output.dir)")
	fs.StringVar(&o.metadata, "metadata", "", "minimal or full: run details in training records (default: the job's output.metadata)")
}

func newExportCommand() *cobra.Command {
	var o exportOptions
	cmd := &cobra.Command{
		Use:   "export JOB.yaml",
		Short: "Write the job's finished samples to dataset files",
		Long: `export reads the done, rejected and dead samples of a job's store and writes
the training files data/<name>.sharegpt.jsonl and data/<name>.parquet
(point a trainer at data/ or a file in it), and beside data/ the side
files: <name>.openai-batch.jsonl with <name>.errors.jsonl (not a training
format), and always <name>.rejected.jsonl and <name>.dead.jsonl.
Training files hold only accepted (done) samples, each with its whole
regenerated conversation; output.metadata: full adds run details. Each file
replaces the previous one atomically once complete. It can run while the
job is running: it writes what is finished so far.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExport(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runExport(ctx context.Context, out io.Writer, path string, o exportOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	formats := spec.Output.Formats
	if len(o.formats) > 0 {
		formats = o.formats
	}
	for _, f := range o.formats {
		if !slices.Contains(export.Formats, f) {
			return fmt.Errorf("--format %q: unknown format (want %s)", f, strings.Join(export.Formats, ", "))
		}
	}
	dir := spec.Output.Dir
	if o.out != "" {
		if dir, err = filepath.Abs(o.out); err != nil {
			return fmt.Errorf("--out %s: %w", o.out, err)
		}
	}
	metadata := spec.Output.Metadata
	switch o.metadata {
	case "":
	case job.MetadataMinimal, job.MetadataFull:
		metadata = o.metadata
	default:
		return fmt.Errorf("--metadata %q: want minimal or full", o.metadata)
	}
	st, err := openExisting(ctx, spec, "run it first")
	if err != nil {
		return err
	}
	defer st.Close()
	desc, err := export.DescribeJob(spec, versionString())
	if err != nil {
		return err
	}
	sum, err := export.ExportWith(ctx, st, dir, formats, spec.BaseName(), export.Options{Metadata: metadata, Describe: desc, TokenIDs: spec.Output.TokenIDs, TokenRows: spec.Output.TokenRows, TrainTruncated: spec.Output.TrainTruncated,
		KeepHistoryReasoning: spec.Generation.Reasoning == job.ReasoningKeep, EngineOf: spec.EngineOf, JobDir: spec.Dir, Profile: export.ProfileOf(spec), Captured: export.CapturedFor(spec, st)})
	if err != nil {
		return err
	}
	writeExportSummary(out, spec, sum)
	return nil
}

// outputProblem is the job file's problem when the export could not write
// into output.dir, with the path at fault relative to the job file.
func outputProblem(spec *job.Spec) error {
	err := export.CheckDir(spec.Output.Dir)
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = fmt.Errorf("%s %s: %w", pe.Op, spec.Rel(pe.Path), pe.Err)
	}
	return spec.FieldErrorf("output.dir", "%s: the output files cannot be written there (%v); make it writable or set output.dir to a folder that is",
		spec.Rel(spec.Output.Dir), err)
}

// writeTokenSummary says how many conversations (turn rows) have token
// ids, when the job exports them.
func writeTokenSummary(w io.Writer, spec *job.Spec, sum export.Summary) {
	n := sum.TokenIDs + sum.TokenIDsUnavailable
	if n == 0 {
		return
	}
	// A trainer reads a file as all-ids or no-ids: the rest are apart.
	var files []string
	for _, f := range sum.Files {
		if f.Format == export.FormatShareGPTNoTokenIDs || f.Format == export.FormatParquetNoTokenIDs {
			files = append(files, filepath.Base(f.Path))
		}
	}
	where := "in " + strings.Join(files, " and ") + " (token_ids says why; not in the training files)"
	rows := "done conversations"
	if spec.Output.TokenRows == job.TokenRowsTurn {
		rows = fmt.Sprintf("turn rows of %d done conversations", sum.Done)
	}
	fmt.Fprintf(w, "token ids: %d of %d %s with input_ids and loss_mask, %d without them, %s\n", sum.TokenIDs, n, rows, sum.TokenIDsUnavailable, where)
}

// writeExportSummary prints the counts and one line per written file,
// its path relative to the job file.
func writeExportSummary(w io.Writer, spec *job.Spec, sum export.Summary) {
	fmt.Fprintf(w, "exported %s, %s, %d dead, %d bad source rows%s\n",
		doneText(sum), rejectedText(sum), sum.Dead, sum.BadRows, relNote(spec))
	writeTokenSummary(w, spec, sum)
	for _, f := range sum.Files {
		fmt.Fprintf(w, "  %-20s %12s  %s\n", f.Format, rowsText(f), spec.Rel(f.Path))
	}
	writeExportNotes(w, spec, sum)
}

// writeExportNotes says which formats were written again unasked, how the
// files verified, and the warnings.
func writeExportNotes(w io.Writer, spec *job.Spec, sum export.Summary) {
	if len(sum.Refreshed) > 0 {
		fmt.Fprintf(w, "also wrote %s again: an earlier export left them in %s, and the manifest describes every file regen wrote there (delete a file to drop its format)\n",
			strings.Join(sum.Refreshed, ", "), spec.Rel(spec.Output.Dir))
	}
	if v := sum.Verified; v.Files > 0 {
		fmt.Fprintf(w, "verified: %d files, %d rows and %d store records match the manifest and the store\n", v.Files, v.Rows, v.Records)
	}
	for _, warn := range sum.Warnings {
		fmt.Fprintln(w, "warning:", warn)
	}
	writeProfileNote(w, spec, sum)
}

// writeProfileNote says how the SpecForge profile's rows are trained: one
// per assistant turn, each supervising its own answer.
func writeProfileNote(w io.Writer, spec *job.Spec, sum export.Summary) {
	if spec.Output.Trainer != job.TrainerSpecForge {
		return
	}
	for _, f := range sum.Files {
		if f.Format == export.FormatShareGPT {
			fmt.Fprintf(w, "trainer specforge: %d rows in %s, one per assistant turn of %d done conversations: train them with data.train_only_last_turn: true\n",
				f.Rows, spec.Rel(f.Path), sum.Done)
		}
	}
}

// doneText is the done count with what it holds: answers cut at
// max_tokens are only among them when the truncated rule is off
// (otherwise they are rejected, and counted there by rule).
func doneText(sum export.Summary) string {
	var parts []string
	if sum.Truncated > 0 {
		parts = append(parts, fmt.Sprintf("%d of them cut at max_tokens, kept because the truncated rule is off", sum.Truncated))
	}
	if sum.Ended > 0 {
		parts = append(parts, fmt.Sprintf("%d conversations ended early", sum.Ended))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d done", sum.Done)
	}
	return fmt.Sprintf("%d done (%s)", sum.Done, strings.Join(parts, ", "))
}

// rejectedText is the rejected count by quality rule.
func rejectedText(sum export.Summary) string {
	if sum.Rejected == 0 {
		return "0 rejected"
	}
	var parts []string
	for _, rule := range slices.Sorted(maps.Keys(sum.RejectedBy)) {
		parts = append(parts, fmt.Sprintf("%s %d", rule, sum.RejectedBy[rule]))
	}
	return fmt.Sprintf("%d rejected (by rule: %s)", sum.Rejected, strings.Join(parts, ", "))
}

// rowsText is a file's row count for the summary; the card and the
// manifest have none.
func rowsText(f export.File) string {
	if f.Format == export.FormatCard || f.Format == export.FormatManifest {
		return ""
	}
	return fmt.Sprintf("%d rows", f.Rows)
}
