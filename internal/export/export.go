package export

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// Formats Export writes.
const (
	FormatShareGPT    = "sharegpt"
	FormatOpenAIBatch = "openai-batch"
	FormatParquet     = "parquet"
)

// Formats of the files every export writes, whatever the formats asked.
const (
	FormatRejected = "rejected"
	FormatDead     = "dead"
)

// FormatShareGPTNoTokenIDs is the ShareGPT file of the done samples whose
// token ids are unavailable, written beside the training file when
// Options.TokenIDs is on: a trainer reads a file as all-ids or no-ids.
const FormatShareGPTNoTokenIDs = FormatShareGPT + "-no-token-ids"

// FormatParquetNoTokenIDs is the same for Parquet.
const FormatParquetNoTokenIDs = FormatParquet + "-no-token-ids"

// FormatShareGPTTruncated and FormatParquetTruncated are the files of the
// done samples whose last answer was cut at max_tokens (kept when the
// truncated rule is off), beside the training files unless
// Options.TrainTruncated: trainers ignore the truncated flag and would
// learn half answers (docs/training-data.md).
const (
	FormatShareGPTTruncated = FormatShareGPT + "-truncated"
	FormatParquetTruncated  = FormatParquet + "-truncated"
)

const (
	rejectedSuffix = ".rejected.jsonl"
	deadSuffix     = ".dead.jsonl"
	noIDsSuffix    = ".sharegpt.no-token-ids.jsonl"
	noIDsParquet   = ".no-token-ids.parquet"
	truncSuffix    = ".sharegpt.truncated.jsonl"
	truncParquet   = ".truncated.parquet"
)

// DataDir is the folder, inside an export's folder, that holds only the
// training files (the ShareGPT JSONL and the Parquet file). A trainer is
// pointed at it: speculators loads every *.json and *.jsonl under a folder
// it is given, so the side files (manifest, rejected, dead, errors,
// openai-batch, no-token-ids) stay one level up, out of its way; the
// card's configs name files in it (docs/training-data.md, "Folder layout").
const DataDir = "data"

// legacyTraining are the training files of name an export wrote before
// DataDir, in the export folder itself: the next export removes them.
func legacyTraining(name string) []string {
	return []string{name + ".sharegpt.jsonl", name + ".parquet"}
}

// TrainingFile is where an export into dir writes name's training file of
// format (sharegpt or parquet).
func TrainingFile(dir, name, format string) string {
	if format == FormatParquet {
		return filepath.Join(dir, DataDir, name+".parquet")
	}
	return filepath.Join(dir, DataDir, name+".sharegpt.jsonl")
}

// Formats of the files that describe an export (File.Format); their Rows is 0.
const (
	FormatCard     = "card"
	FormatManifest = "manifest"
)

// Formats lists every format, in the order Export writes them.
var Formats = []string{FormatShareGPT, FormatOpenAIBatch, FormatParquet}

// RejectedFile is where an export into dir writes the job name's
// rejected samples (always, whatever the formats).
func RejectedFile(dir, name string) string { return filepath.Join(dir, name+rejectedSuffix) }

// File is one file an export wrote.
type File struct {
	Format string // sharegpt, openai-batch, openai-batch-errors, parquet, their -no-token-ids files, rejected or dead
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
	// RejectedBy counts the rejected samples by quality rule.
	RejectedBy map[string]int
	Dead       int // dead samples
	BadRows    int // source rows that never became samples (ingest errors)
	// Warnings are what the export left undone on purpose (a README.md
	// regen did not write is kept, and no card written).
	Warnings []string
	// With Options.TokenIDs: training rows (done samples, or their turns
	// with turn rows) exported with input_ids and loss_mask, and those
	// whose record says token_ids: unavailable (in the no-token-ids file,
	// not the training file).
	TokenIDs            int
	TokenIDsUnavailable int
	// Refreshed are the formats not asked for that an earlier export had
	// written into the directory, written again (earlierFormats).
	Refreshed []string
	// NoSystemRows counts, under the SpecForge profile, the ShareGPT
	// training rows without a system message: SpecForge gives them its
	// template's default system prompt.
	NoSystemRows int
	// Verified is the check of the files just written (Verify).
	Verified Report
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
	// TokenRows is what a training row with token ids holds:
	// TokenRowsConversation ("" too) one row per conversation,
	// TokenRowsTurn one row per assistant turn (id "<sample id>/turn<k>",
	// with conversation_id and turn). Only with TokenIDs.
	TokenRows string
	// KeepHistoryReasoning says earlier answers' reasoning was sent back
	// with the history (generation.reasoning: keep): a turn row's messages
	// keep it; otherwise only the turn's own answer has its reasoning.
	KeepHistoryReasoning bool
	// EngineOf names the engine of an endpoint URL, for the reason a
	// record has no token ids; nil names the URL.
	EngineOf func(endpoint string) string
	// TrainTruncated writes done samples cut at max_tokens into the
	// training files (output.train_truncated); otherwise they go to the
	// truncated files beside them.
	TrainTruncated bool
	// JobDir is the job file's folder: dead letters' origins are written
	// relative to it (job.RelTo), also those stored absolute.
	JobDir string
	// Captured lists the captured hidden-state files in the manifest, the
	// card and a sha256sum file (a job with a capture section); nil: none.
	Captured *CapturedFiles
	// Profile is the trainer the ShareGPT training file is laid out for
	// (output.trainer, ProfileOf).
	Profile Profile
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
	want, err := wantedFormats(formats)
	if err != nil {
		return Summary{}, err
	}
	if err := o.Profile.check(o); err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	data := filepath.Join(dir, DataDir)
	if err := os.MkdirAll(data, 0o755); err != nil {
		return Summary{}, fmt.Errorf("export: create %s: %w", data, err)
	}
	start := time.Now()
	damaged := damagedFiles(dir, name)
	refreshed := earlierFormats(dir, name, want)
	w, err := openWriters(createAtomic, dir, name, want, o)
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			w.abort()
			_ = os.Remove(data) // only when empty: this run made it
		}
	}()
	x := &exporter{w: w, o: o, seen: serverTally{}}
	x.sum.Warnings = damaged
	if err := x.stream(ctx, st); err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	for _, s := range w.list {
		if g, ok := s.(*sharegptSink); ok {
			x.sum.NoSystemRows = g.noSystem
		}
	}
	outs, err := w.finish()
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	// The card and the manifest describe the files above, so they are
	// renamed last: a manifest on disk names files already in place.
	described, err := describe(ctx, st, dir, name, o, &x.sum, x.seen, x.inputs, outs)
	for _, d := range described {
		w.list = append(w.list, fileSink{d})
	}
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	committed = true // from here each rename replaces one file atomically
	files, err := renameAll(w.files())
	if err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	if err := removeStaleNoIDs(dir, name, want, o); err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	if err := removeLegacyTraining(dir, name); err != nil {
		return Summary{}, fmt.Errorf("export: %w", err)
	}
	x.sum.Files, x.sum.Refreshed = files, refreshed
	for _, d := range []string{filepath.Join(dir, DataDir), dir} {
		if err := syncDir(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			return x.sum, fmt.Errorf("export: %w", err)
		}
	}
	// The files are read back and compared with the manifest and the
	// store: an export that does not verify is an error, not a dataset.
	rep, err := verify(ctx, st, dir, name, o, start)
	if err == nil {
		err = rep.Err()
	}
	if err != nil {
		return x.sum, fmt.Errorf("export: %w", err)
	}
	x.sum.Verified = rep
	return x.sum, nil
}

// wantedFormats is the set of formats asked for, each one regen writes.
func wantedFormats(formats []string) (map[string]bool, error) {
	want := map[string]bool{}
	for _, f := range formats {
		if !slices.Contains(Formats, f) {
			return nil, fmt.Errorf("%w %q (want %s)", ErrUnknownFormat, f, strings.Join(Formats, ", "))
		}
		want[f] = true
	}
	return want, nil
}

// removeStaleNoIDs removes the no-token-ids files an earlier export with
// token ids left when this one writes their format without them, and the
// truncated files when this one trains on truncated rows: they hold
// nothing this export's manifest describes.
func removeStaleNoIDs(dir, name string, want map[string]bool, o Options) error {
	stale := map[string][]string{}
	if !o.TokenIDs {
		stale[FormatShareGPT] = append(stale[FormatShareGPT], noIDsSuffix)
		stale[FormatParquet] = append(stale[FormatParquet], noIDsParquet)
	}
	if o.TrainTruncated { // the truncated rows are in the training files now
		stale[FormatShareGPT] = append(stale[FormatShareGPT], truncSuffix)
		stale[FormatParquet] = append(stale[FormatParquet], truncParquet)
	}
	for format, suffixes := range stale {
		for _, suffix := range suffixes {
			if !want[format] {
				continue
			}
			if err := os.Remove(filepath.Join(dir, name+suffix)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove the earlier %s: %w", name+suffix, err)
			}
		}
	}
	return nil
}

// removeLegacyTraining removes the training files an export from before
// DataDir left in dir itself: this export wrote their rows into DataDir
// (earlierFormats asked for their formats), and a trainer pointed at dir
// must not find two copies.
func removeLegacyTraining(dir, name string) error {
	for _, base := range legacyTraining(name) {
		if err := os.Remove(filepath.Join(dir, base)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove the earlier layout's %s: %w", base, err)
		}
	}
	return nil
}

// ErrUnknownFormat is a format Export does not write.
var ErrUnknownFormat = errors.New("unknown format")

// earlierFormats adds to want the formats an earlier export wrote into dir
// (their files are there) and returns them: they are written again with
// the others, so the manifest describes every file regen wrote there and
// each one is the store's current answer.
func earlierFormats(dir, name string, want map[string]bool) []string {
	var added []string
	for _, f := range Formats {
		if want[f] {
			continue
		}
		files := formatFiles(name, f)
		if f == FormatShareGPT {
			files = append(files, legacyTraining(name)[0])
		} else if f == FormatParquet {
			files = append(files, legacyTraining(name)[1])
		}
		for _, base := range files {
			if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(base))); err == nil {
				want[f] = true
				added = append(added, f)
				break
			}
		}
	}
	return added
}

// writers is every sink of one export.
type writers struct {
	list []sink
	pq   *parquetSink // closed before the files are synced
	dead *deadSink    // also takes the ingest errors
}

// openWriters creates the files of the formats wanted, the rejected and
// the dead letters; on error it removes those it created.
func openWriters(create createFunc, dir, name string, want map[string]bool, o Options) (*writers, error) {
	w := &writers{}
	full := o.Metadata == MetadataFull
	add := func(s sink, err error) error {
		if err != nil {
			w.abort()
			return err
		}
		w.list = append(w.list, s)
		return nil
	}
	path := func(suffix string) string { return filepath.Join(dir, name+suffix) }
	if want[FormatShareGPT] {
		if err := add(newShareGPT(create, TrainingFile(dir, name, FormatShareGPT), sidePaths(path(noIDsSuffix), path(truncSuffix), o), full, o.TokenIDs, o.Profile)); err != nil {
			return nil, err
		}
	}
	if want[FormatOpenAIBatch] {
		if err := add(newBatch(create, path(".openai-batch.jsonl"), path(".errors.jsonl"))); err != nil {
			return nil, err
		}
	}
	var err error
	if want[FormatParquet] {
		if w.pq, err = newParquet(create, TrainingFile(dir, name, FormatParquet), sidePaths(path(noIDsParquet), path(truncParquet), o), full, o.TokenIDs, o.TokenIDs && o.TokenRows == TokenRowsTurn); add(w.pq, err) != nil {
			return nil, err
		}
	}
	if err := add(newRejected(create, RejectedFile(dir, name))); err != nil {
		return nil, err
	}
	if w.dead, err = newDead(create, path(deadSuffix), o.JobDir); add(w.dead, err) != nil {
		return nil, err
	}
	return w, nil
}

// sides are the side files of a training format: where rows without token
// ids go (with Options.TokenIDs) and truncated rows (unless
// Options.TrainTruncated); "" for a file not written.
type sides struct{ noIDs, truncated string }

func sidePaths(noIDs, truncated string, o Options) sides {
	var s sides
	if o.TokenIDs {
		s.noIDs = noIDs
	}
	if !o.TrainTruncated {
		s.truncated = truncated
	}
	return s
}

func (w *writers) files() []*output {
	var outs []*output
	for _, s := range w.list {
		outs = append(outs, s.files()...)
	}
	return outs
}

// abort removes every temporary file.
func (w *writers) abort() {
	for _, o := range w.files() {
		o.af.abort()
	}
}

// finish closes the Parquet writer and syncs every file.
func (w *writers) finish() ([]*output, error) {
	if w.pq != nil {
		if err := w.pq.close(); err != nil {
			return nil, err
		}
	}
	outs := w.files()
	for _, o := range outs {
		if err := o.af.sync(); err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// renameAll puts every file in place, in order; after a failure it removes
// the temporary files not yet renamed.
func renameAll(outs []*output) ([]File, error) {
	var files []File
	for i, o := range outs {
		if err := o.af.rename(); err != nil {
			for _, rest := range outs[i:] {
				rest.af.abort()
			}
			return nil, err
		}
		files = append(files, File{Format: o.format, Path: o.af.final, Rows: o.rows})
	}
	return files, nil
}

// exporter streams the store's finished samples and ingest errors to the
// writers, counting them.
type exporter struct {
	w    *writers
	o    Options
	sum  Summary
	seen serverTally
	// hold, when set, keeps a record from the writers and the counts
	// (Verify: a sample finished after the export began).
	hold func(*record) bool
	// inputs is each written training row's tokenrows.InputHash by row id
	// (Options.Captured with token ids): a captured file is listed only
	// for the row whose ids it holds.
	inputs map[string]string
}

func (x *exporter) stream(ctx context.Context, st Store) error {
	err := st.Finished(ctx, func(row store.Row) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return x.row(row)
	})
	if err != nil {
		return err
	}
	// Streamed: a wrong field mapping makes every source row bad, so they
	// may be as many as the source has rows.
	return st.EachIngestError(ctx, func(e store.IngestError) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		x.sum.BadRows++
		return x.w.dead.ingestError(e)
	})
}

// row counts one finished sample and writes it to every sink.
func (x *exporter) row(row store.Row) error {
	rec, err := decodeRecord(row)
	if err != nil {
		return err
	}
	rec.engineName = x.o.EngineOf
	rec.turnRows = x.o.TokenIDs && x.o.TokenRows == TokenRowsTurn
	rec.keepHistoryReasoning = x.o.KeepHistoryReasoning
	rec.specForge = x.o.Profile.specForge()
	if x.hold != nil && x.hold(rec) {
		return nil
	}
	switch row.State {
	case store.Done:
		x.seen.addRecord(rec)
		if err := x.done(rec); err != nil {
			return err
		}
	case store.Rejected:
		x.seen.addRecord(rec)
		x.sum.Rejected++
		if x.sum.RejectedBy == nil {
			x.sum.RejectedBy = map[string]int{}
		}
		x.sum.RejectedBy[rec.row.Rule]++
	case store.Dead:
		x.sum.Dead++
	default:
		return fmt.Errorf("sample %s: unexpected state %q among finished samples", row.ID, row.State)
	}
	for _, s := range x.w.list {
		if err := s.write(rec); err != nil {
			return err
		}
	}
	return nil
}

func (x *exporter) done(rec *record) error {
	sum := &x.sum
	sum.Done++
	if sum.DoneByGeneration == nil {
		sum.DoneByGeneration = map[int]int{}
	}
	sum.DoneByGeneration[rec.last().Generation]++
	if x.o.TokenIDs {
		if err := countTokens(sum, rec); err != nil {
			return err
		}
		if err := x.noteInputs(rec); err != nil {
			return err
		}
	}
	if rec.truncated() {
		sum.Truncated++
	}
	if rec.row.Result.EndReason != "" {
		sum.Ended++
	}
	return nil
}
