package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/capture"
	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

func init() { addCommand(newVerifyCommand) }

type verifyOptions struct {
	out string
}

func (o *verifyOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.out, "out", "", "output directory holding the export (default: the job's output.dir)")
}

func newVerifyCommand() *cobra.Command {
	var o verifyOptions
	cmd := &cobra.Command{
		Use:   "verify JOB.yaml",
		Short: "Check an export's files against its manifest and the store",
		Long: `verify reads <name>.manifest.json in the output directory and checks every
file it lists (present, bytes, SHA-256, rows), that no file regen wrote is
missing from it, and every record of the training, rejected, dead and batch
files against the store's current answer, in order. It prints each file's
first mismatch with its line (Parquet row) and sample id and exits 1, or
says ok and exits 0. Every export runs the same check on the files it wrote.

A job with a capture: section also has every captured hidden-state file
re-hashed against the store's record (present, bytes, SHA-256), the
capture folder checked for .safetensors files no record lists, and the
manifest's list of them compared with the store's.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerify(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runVerify(ctx context.Context, out io.Writer, path string, o verifyOptions) error {
	spec, err := job.LoadContext(ctx, path)
	if err != nil {
		return err
	}
	dir := spec.Output.Dir
	if o.out != "" {
		if dir, err = filepath.Abs(o.out); err != nil {
			return fmt.Errorf("--out %s: %w", o.out, err)
		}
	}
	st, err := openExisting(ctx, spec, "run it first")
	if err != nil {
		return err
	}
	defer st.Close()
	start := time.Now()
	capRep, err := verifyCaptures(ctx, out, spec, st)
	if err != nil {
		return err
	}
	rep, err := export.Verify(ctx, st, dir, spec.BaseName(), export.Options{Metadata: spec.Output.Metadata, TokenIDs: spec.Output.TokenIDs, TokenRows: spec.Output.TokenRows, TrainTruncated: spec.Output.TrainTruncated,
		KeepHistoryReasoning: spec.Generation.Reasoning == job.ReasoningKeep, EngineOf: spec.EngineOf, JobDir: spec.Dir, Profile: export.ProfileOf(spec), Captured: export.CapturedFor(spec, st)})
	if err != nil {
		return err
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(out, spec.Rel(filepath.Join(dir, p.Path))+p.String()[len(p.Path):])
	}
	took := time.Since(start).Round(time.Millisecond)
	if err := capRep.Err(); err != nil {
		return &exitError{code: 1, err: fmt.Errorf("%w; %d problems in %d hidden-state files checked, %d in the export's (%s); regen capture --recheck %s captures again the files missing or changed",
			err, len(capRep.Problems), capRep.Files, len(rep.Problems), took, spec.Rel(spec.Path))}
	}
	if err := rep.Err(); err != nil {
		return &exitError{code: 1, err: fmt.Errorf("%s: %d problems in %d files checked (%s); regen export %s writes the files again from the store",
			spec.Rel(rep.Manifest), len(rep.Problems), rep.Files, took, spec.Rel(spec.Path))}
	}
	if n := len(rep.StaleCaptures); n > 0 {
		fmt.Fprintf(out, "note: %d captured hidden-state files are stale, not of an exported row's input_ids (the first: %s), and the manifest rightly leaves them out; regen capture %s captures those rows again\n",
			n, rep.StaleCaptures[0], spec.Rel(spec.Path))
	}
	hidden := ""
	if spec.Capture != nil {
		hidden = fmt.Sprintf(", %d hidden-state files (%s) match the store", capRep.Files, monitor.Size(capRep.Bytes))
	}
	fmt.Fprintf(out, "ok: %s: %d files, %d rows, %d store records match%s (%s)\n", spec.Rel(rep.Manifest), rep.Files, rep.Rows, rep.Records, hidden, took)
	return nil
}

// verifyCaptures re-hashes the job's captured hidden-state files against
// the store's records (and looks for files no record lists), printing
// each problem; nothing for a job without a capture section.
func verifyCaptures(ctx context.Context, out io.Writer, spec *job.Spec, st store.Store) (capture.VerifyReport, error) {
	if spec.Capture == nil {
		return capture.VerifyReport{}, nil
	}
	rep, err := capture.Verify(ctx, st, spec.Dir, spec.Capture.Dir)
	if err != nil {
		return rep, err
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(out, p.String())
	}
	return rep, nil
}
