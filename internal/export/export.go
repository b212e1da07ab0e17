package export

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/regen-dev/regen/internal/store"
)

// Formats Export writes.
const (
	FormatShareGPT    = "sharegpt"
	FormatOpenAIBatch = "openai-batch"
	FormatParquet     = "parquet"
)

// Formats of the files that describe an export (File.Format); their Rows is 0.
const (
	FormatCard     = "card"
	FormatManifest = "manifest"
)

// Formats lists every format, in the order Export writes them.
var Formats = []string{FormatShareGPT, FormatOpenAIBatch, FormatParquet}

// RejectedFile is where an export into dir writes the job name's
// rejected samples (always, whatever the formats).
func RejectedFile(dir, name string) string { return filepath.Join(dir, name+".rejected.jsonl") }

// File is one file an export wrote.
type File struct {
	Format string // sharegpt, openai-batch, openai-batch-errors, parquet or dead
	Path   string
	Rows   int // lines (rows for Parquet)
}

// Summary is what an export wrote and what it saw.
type Summary struct {
	Files     []File
	Done      int // done samples (truncated ones included)
	Truncated int // done with finish_reason "length" (only when the truncated rule is off)
	Ended     int // done conversations that ended before their last planned turn
	Rejected  int
	Dead      int // dead samples
	BadRows   int // source rows that never became samples (ingest errors)
	// Warnings are what the export left undone on purpose (a README.md
	// regen did not write is kept, and no card written).
	Warnings []string
	// With Options.TokenIDs: done samples exported with input_ids and
	// loss_mask, and those whose record says token_ids: unavailable.
	TokenIDs            int
	TokenIDsUnavailable int
	// DoneByGeneration counts done samples by the configuration
	// generation of their last answer.
	DoneByGeneration map[int]int
}

// Metadata levels of Options.
const (
	MetadataMinimal = "minimal"
	MetadataFull    = "full"
)

// Options tune an export; the zero value writes minimal metadata.
type Options struct {
	// Metadata: MetadataMinimal keeps run details (lanes, finish reasons,
	// usage, endpoint URLs, attempts) out of the training records;
	// MetadataFull adds them.
	Metadata string
	// Describe fills the manifest's and the card's job, configuration and
	// regen version (DescribeJob); zero leaves them to the store's facts.
	Describe Describe
	// TokenIDs adds input_ids and loss_mask (or token_ids: "unavailable:
	// why") to every ShareGPT line and Parquet row.
	TokenIDs bool
	// EngineOf names the engine of an endpoint URL, for the reason a
	// record has no token ids; nil names the URL.
	EngineOf func(endpoint string) string
	// JobDir is the job file's folder: dead letters' origins are written
	// relative to it (job.RelTo), also those stored absolute.
	JobDir string
}

// Store is what export reads: the whole-job walks its files stream from
// and the headline numbers of the manifest.
type Store interface {
	store.Progress
	store.Dataset
}

// Export is ExportWith zero Options.
func Export(ctx context.Context, st Store, dir string, formats []string, name string) (Summary, error) {
	return ExportWith(ctx, st, dir, formats, name, Options{})
}

// ExportWith writes the finished samples of st into dir as
// <name>.sharegpt.jsonl, <name>.openai-batch.jsonl with <name>.errors.jsonl,
// and <name>.parquet, for the formats asked, plus <name>.rejected.jsonl and
// <name>.dead.jsonl always. Training files hold only done (accepted)
// samples. Files appear only once all of them are complete; on error none
// of this run's files replace the previous ones and no temporary file is
// left behind.
func ExportWith(ctx context.Context, st Store, dir string, formats []string, name string, o Options) (Summary, error) {
	var sum Summary
	full := o.Metadata == MetadataFull
	want := map[string]bool{}
	for _, f := range formats {
		if !slices.Contains(Formats, f) {
			return sum, fmt.Errorf("export: unknown format %q", f)
		}
		want[f] = true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return sum, fmt.Errorf("export: create %s: %w", dir, err)
	}

	var (
		sinks []sink
		pq    *parquetSink
		dead  *deadSink
		seen  = serverTally{}
	)
	all := func() []*output {
		var outs []*output
		for _, s := range sinks {
			outs = append(outs, s.files()...)
		}
		return outs
	}
	committed := false
	defer func() {
		if !committed {
			for _, o := range all() {
				o.af.abort()
			}
		}
	}()
	open := func(s sink, err error) error {
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		sinks = append(sinks, s)
		return nil
	}
	path := func(suffix string) string { return filepath.Join(dir, name+suffix) }
	if want[FormatShareGPT] {
		if err := open(newShareGPT(path(".sharegpt.jsonl"), full, o.TokenIDs)); err != nil {
			return sum, err
		}
	}
	if want[FormatOpenAIBatch] {
		if err := open(newBatch(path(".openai-batch.jsonl"), path(".errors.jsonl"))); err != nil {
			return sum, err
		}
	}
	if want[FormatParquet] {
		var err error
		pq, err = newParquet(path(".parquet"), full, o.TokenIDs)
		if err := open(pq, err); err != nil {
			return sum, err
		}
	}
	if err := open(newRejected(RejectedFile(dir, name))); err != nil {
		return sum, err
	}
	{
		var err error
		dead, err = newDead(path(".dead.jsonl"), o.JobDir)
		if err := open(dead, err); err != nil {
			return sum, err
		}
	}

	err := st.Finished(ctx, func(row store.Row) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := decodeRecord(row)
		if err != nil {
			return err
		}
		rec.engineName = o.EngineOf
		switch row.State {
		case store.Done:
			seen.addRecord(rec)
			sum.Done++
			if sum.DoneByGeneration == nil {
				sum.DoneByGeneration = map[int]int{}
			}
			sum.DoneByGeneration[rec.last().Generation]++
			if o.TokenIDs {
				countTokens(&sum, rec)
			}
			if rec.truncated() {
				sum.Truncated++
			}
			if row.Result.EndReason != "" {
				sum.Ended++
			}
		case store.Rejected:
			seen.addRecord(rec)
			sum.Rejected++
		case store.Dead:
			sum.Dead++
		default:
			return fmt.Errorf("sample %s: unexpected state %q among finished samples", row.ID, row.State)
		}
		for _, s := range sinks {
			if err := s.write(rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	// Streamed: a wrong field mapping makes every source row bad, so they
	// may be as many as the source has rows.
	err = st.EachIngestError(ctx, func(e store.IngestError) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		sum.BadRows++
		return dead.ingestError(e)
	})
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}

	if pq != nil {
		if err := pq.close(); err != nil {
			return Summary{}, fmt.Errorf("export: %w", err)
		}
	}
	outs := all()
	for _, o := range outs {
		if err := o.af.sync(); err != nil {
			return Summary{}, fmt.Errorf("export: %w", err)
		}
	}
	// The card and the manifest describe the files above, so they are
	// renamed last: a manifest on disk names files already in place.
	described, err := describe(ctx, st, dir, name, o.Describe, &sum, seen, outs)
	for _, d := range described {
		sinks = append(sinks, fileSink{d})
	}
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	outs = all()
	// From here each rename replaces one file atomically.
	for i, o := range outs {
		if err := o.af.rename(); err != nil {
			for _, rest := range outs[i:] {
				rest.af.abort()
			}
			committed = true
			return Summary{}, fmt.Errorf("export: %w", err)
		}
		sum.Files = append(sum.Files, File{Format: o.format, Path: o.af.final, Rows: o.rows})
	}
	committed = true
	if err := syncDir(dir); err != nil {
		return sum, fmt.Errorf("export: %w", err)
	}
	return sum, nil
}
