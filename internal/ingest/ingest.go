// Package ingest brings a job's sources into the store, once: a manifest
// entry per source file says it is complete, so an unchanged file is not
// read again; files are named relative to the job file (absolute outside
// its folder) in the manifest and in origins, so a job folder moved with
// its store is the same job; a named lock per file lets one worker of
// several read it while the others go on. It reads through
// internal/source and writes through the store; it never dispatches (the
// runner wakes the dispatcher through the wake callback after each
// committed batch).
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/source"
	"github.com/regen-dev/regen/internal/store"
)

// Stats counts what one ingest pass did. The rows of a file skipped
// because the manifest says it is in already count in Read, from the
// manifest (and in Unread): the counts are the same whether a file was read
// again or not, and the summary says which rows were read.
type Stats struct {
	Read     int // rows of the source files, good and bad, read now or not
	Unread   int // of Read, the rows of files not read (counted from the manifest)
	Inserted int // new samples (the other good rows were already stored)
	Bad      int // rows dead-lettered at ingest
	Files    int // source files
	Skipped  int // files unchanged since a complete ingest, not read again
	ByOthers int // files another worker sharing the store ingested meanwhile
	// Duplicates are rows skipped because another row already took their
	// id, over every ingest of the job so far.
	Duplicates int
	// Copies are the samples beyond one per row that samples_per_prompt
	// made from the rows that are samples (not from duplicates).
	Copies int
	// Dropped are samples stored under an earlier mapping whose rows now
	// map to other ids (a new configuration changed an id-less body).
	Dropped int
	// Merged is the samples_per_prompt of the sources without an id
	// mapping whose identical prompts were merged (0 when none were): their
	// duplicates are the k samples of one prompt, which the summary says.
	Merged int
}

// Samples is the number of samples the good rows stand for: new or
// already stored (rows skipped for a taken id are not).
func (s Stats) Samples() int { return s.Read - s.Bad - s.Duplicates + s.Copies }

// String is the ingest summary the run prints and records.
func (s Stats) String() string {
	out := s.rowsText() + fmt.Sprintf(": %d new samples, %d already stored, %d bad rows (dead letters)",
		s.Inserted, max(s.Samples()-s.Inserted, 0), s.Bad)
	if s.Dropped > 0 {
		out += fmt.Sprintf(", %d samples of the earlier mapping dropped (their rows now make other samples)", s.Dropped)
	}
	if s.Duplicates > 0 {
		out += fmt.Sprintf(", %d rows skipped because another row has their id (see regen stats)", s.Duplicates)
		if s.Merged > 1 {
			out += fmt.Sprintf("; identical prompts without an id mapping became %d samples of one prompt, not %d per row", s.Merged, s.Merged)
		}
	}
	return out
}

// rowsText says how many rows the sources hold and which of them were read
// now: "603 rows read", "603 rows in 2 files unchanged since their last
// ingest, not read again", or the split of the two.
func (s Stats) rowsText() string {
	var unread []string
	if s.Skipped > 0 {
		unread = append(unread, fmt.Sprintf("%s unchanged since the last ingest", files(s.Skipped)))
	}
	if s.ByOthers > 0 {
		unread = append(unread, fmt.Sprintf("%s ingested by other workers", files(s.ByOthers)))
	}
	switch {
	case len(unread) == 0:
		return fmt.Sprintf("%d rows read", s.Read)
	case s.Unread == s.Read && s.Skipped+s.ByOthers == s.Files:
		return fmt.Sprintf("%d rows in %s, not read again", s.Read, strings.Join(unread, " and "))
	}
	return fmt.Sprintf("%d rows: %d read, %d not read again (%s)", s.Read, s.Read-s.Unread, s.Unread, strings.Join(unread, ", "))
}

func files(n int) string {
	if n == 1 {
		return "1 file"
	}
	return fmt.Sprintf("%d files", n)
}

const ingestBatch = 1000

// ingestPoll is how often a worker looks at files another worker is
// ingesting, to take over if that worker dies.
const ingestPoll = time.Second

// Store is what ingesting needs of the store: the intake, the named lock
// that lets one worker of several read a file, and the duplicate count it
// reports.
type Store interface {
	store.Intake
	TryLock(ctx context.Context, name string) (unlock func() error, ok bool, err error)
	IngestDuplicates(ctx context.Context, limit int) (store.Duplicates, error)
}

// Ingester brings a job's sources into the store once: a manifest entry
// per source file says it is complete, so an unchanged file is not read
// again, and a named lock per file makes one worker of several read it
// while the others go on to other files (or dispatch).
type Ingester struct {
	spec *job.Spec
	st   Store
	log  *slog.Logger
	// wake is called after every committed batch: new samples to claim.
	wake  func()
	stats Stats
}

// New returns an ingester of spec's sources into st; wake, when not nil,
// is called after every committed batch (new samples to claim).
func New(spec *job.Spec, st Store, log *slog.Logger, wake func()) *Ingester {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Ingester{spec: spec, st: st, log: log, wake: wake}
}

// Run reads every source file not yet fully ingested and stores new
// samples and bad rows. It is idempotent: samples already stored are
// skipped by id, bad rows by origin, whole unchanged files by the manifest.
func Run(ctx context.Context, spec *job.Spec, st Store) (Stats, error) {
	in := New(spec, st, nil, nil)
	plan, err := in.Plan()
	if err != nil {
		return Stats{}, err
	}
	return in.Run(ctx, plan)
}

// SourcePlan is one source and its files, resolved up front so a missing
// path fails the run before any server is launched.
type SourcePlan struct {
	src   job.Source
	files []string
}

// SourceError stops a run on a source it cannot read (missing, truncated,
// corrupt): a re-run fails the same way until the file is fixed, so the
// run ends FAILED with what to fix, not STOPPED with "re-run to resume".
type SourceError struct {
	Path string // relative to the job file when inside its directory
	Err  error
}

func (e *SourceError) Error() string { return e.Err.Error() }
func (e *SourceError) Unwrap() error { return e.Err }

// Fix says what to do before a re-run can go on.
func (e *SourceError) Fix() string {
	return fmt.Sprintf("source %s cannot be read: fix or replace it (or take it out of the job), then re-run; the samples already stored are kept", e.Path)
}

// sourceError wraps err, an error reading the source file path, unless the
// store (a write from the row callbacks) or an interrupt caused it.
func (in *Ingester) sourceError(ctx context.Context, path string, err error) error {
	var se storeError
	if err == nil || ctx.Err() != nil || errors.As(err, &se) {
		return err
	}
	return &SourceError{Path: in.spec.Rel(path), Err: relError{err, in.spec.RelText(err.Error())}}
}

// relError is err with the paths in its text relative to the job file.
type relError struct {
	err  error
	text string
}

func (e relError) Error() string { return e.text }
func (e relError) Unwrap() error { return e.err }

// storeError marks a store failure met while reading a source, so it is
// not taken for the source's.
type storeError struct{ err error }

func (e storeError) Error() string { return e.err.Error() }
func (e storeError) Unwrap() error { return e.err }

func (in *Ingester) Plan() ([]SourcePlan, error) {
	var out []SourcePlan
	for _, src := range in.spec.Sources {
		files, err := source.Files(src, in.spec.Dir)
		if err != nil {
			return nil, in.sourceError(context.Background(), src.Path, fmt.Errorf("ingest partition %s: %w", src.Partition, err))
		}
		out = append(out, SourcePlan{src: src, files: files})
		in.stats.Files += len(files)
	}
	return out, nil
}

// unread counts the files of plan the manifest does not show complete and
// unchanged: the files ingest would read.
func (in *Ingester) Unread(ctx context.Context, plan []SourcePlan) (int, error) {
	n := 0
	for _, p := range plan {
		for _, path := range p.files {
			info, err := source.Fingerprint(p.src, path)
			if err != nil {
				return 0, in.sourceError(ctx, path, fmt.Errorf("fingerprint %s: %w", path, err))
			}
			if _, ok, err := in.complete(ctx, p.src, path, info); err != nil {
				return 0, err
			} else if !ok {
				n++
			}
		}
	}
	return n, nil
}

// CopiesAsIngested reports whether every source of plan with
// samples_per_prompt above 1 has a file in the manifest ingested with
// that many copies (the file fingerprint holds them). A store from before
// the configuration fingerprint held samples_per_prompt is then known to
// hold this job's samples.
func (in *Ingester) CopiesAsIngested(ctx context.Context, plan []SourcePlan) (bool, error) {
	for _, p := range plan {
		if p.src.SamplesPerPrompt <= 1 {
			continue
		}
		same := false
		for _, path := range p.files {
			m, ok, err := in.st.SourceFile(ctx, p.src.Partition, in.spec.Rel(path))
			if err != nil {
				return false, err
			}
			if !ok {
				continue
			}
			info, err := source.Fingerprint(p.src, path)
			if err != nil {
				return false, in.sourceError(ctx, path, fmt.Errorf("fingerprint %s: %w", path, err))
			}
			if same = m.Fingerprint == info.Fingerprint; same {
				break
			}
		}
		if !same {
			return false, nil
		}
	}
	return true, nil
}

func (in *Ingester) Run(ctx context.Context, plan []SourcePlan) (Stats, error) {
	for _, p := range plan {
		if err := in.source(ctx, p); err != nil {
			return in.stats, fmt.Errorf("ingest partition %s: %w", p.src.Partition, err)
		}
		// Every file of the source is in: a sample a new configuration held
		// back that no row rebuilt has no row any more (its id was a hash of
		// the old body).
		n, err := in.st.DropStale(ctx, p.src.Partition)
		if err != nil {
			return in.stats, fmt.Errorf("ingest partition %s: %w", p.src.Partition, err)
		}
		in.stats.Dropped += n
	}
	d, err := in.st.IngestDuplicates(ctx, 1)
	if err != nil {
		return in.stats, fmt.Errorf("ingest: %w", err)
	}
	in.stats.Duplicates = d.Total
	if err := in.duplicateCopies(ctx, d); err != nil {
		return in.stats, err
	}
	return in.stats, nil
}

// perPrompt is the samples_per_prompt of partition (1 when unknown).
func (in *Ingester) perPrompt(partition string) int {
	for _, src := range in.spec.Sources {
		if src.Partition == partition {
			return max(src.SamplesPerPrompt, 1)
		}
	}
	return 1
}

// duplicateCopies takes the copies of duplicate rows out of Copies (they
// made no sample) and notes the sources whose identical prompts merged.
// Only a job with samples_per_prompt reads the duplicates one by one.
func (in *Ingester) duplicateCopies(ctx context.Context, d store.Duplicates) error {
	multi := false
	for _, src := range in.spec.Sources {
		multi = multi || src.SamplesPerPrompt > 1
	}
	if d.Total == 0 || !multi {
		return nil
	}
	all, err := in.st.IngestDuplicates(ctx, 0)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	for _, x := range all.Examples {
		k := in.perPrompt(x.Partition)
		in.stats.Copies -= k - 1
		if x.SameContent && k > 1 && in.idLess(x.Partition) {
			in.stats.Merged = max(in.stats.Merged, k)
		}
	}
	return nil
}

// idLess reports whether partition's ids are content hashes.
func (in *Ingester) idLess(partition string) bool {
	for _, src := range in.spec.Sources {
		if src.Partition == partition {
			return src.ID == ""
		}
	}
	return false
}

// source ingests one source's files. Files another worker holds are
// revisited until someone completes them; with a row limit, files are
// taken strictly in order, since each one's share depends on the rows
// before it.
func (in *Ingester) source(ctx context.Context, p SourcePlan) error {
	used := 0 // good rows of this source so far, for src.Limit
	var waiting []string
	for _, path := range p.files {
		if p.src.Limit > 0 && used >= p.src.Limit {
			return nil
		}
		for revisit := false; ; revisit = true {
			rows, done, err := in.file(ctx, p.src, path, used, revisit)
			if err != nil {
				return err
			}
			if done {
				used += rows
				break
			}
			if p.src.Limit == 0 {
				waiting = append(waiting, path)
				break
			}
			if err := sleepCtx(ctx, ingestPoll); err != nil {
				return err
			}
		}
	}
	for len(waiting) > 0 {
		if err := sleepCtx(ctx, ingestPoll); err != nil {
			return err
		}
		var still []string
		for _, path := range waiting {
			_, done, err := in.file(ctx, p.src, path, 0, true)
			if err != nil {
				return err
			}
			if !done {
				still = append(still, path)
			}
		}
		waiting = still
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// file makes sure path is in the store. done is false when another worker
// is reading it now; rows is the file's good rows (for the source's limit).
// revisit says the file was found locked before, so finding it complete now
// means another worker ingested it.
func (in *Ingester) file(ctx context.Context, src job.Source, path string, used int, revisit bool) (rows int, done bool, err error) {
	info, err := source.Fingerprint(src, path)
	if err != nil {
		return 0, false, in.sourceError(ctx, path, fmt.Errorf("fingerprint %s: %w", path, err))
	}
	if m, ok, err := in.complete(ctx, src, path, info); err != nil || ok {
		if ok {
			in.skipped(m, revisit)
		}
		return m.Rows, ok, err
	}
	unlock, ok, err := in.st.TryLock(ctx, "ingest:"+src.Partition+":"+in.spec.Rel(path))
	if err != nil {
		return 0, false, err
	}
	if !ok {
		return 0, false, nil
	}
	defer func() {
		if uerr := unlock(); uerr != nil {
			in.log.Warn("release ingest lock", "file", path, "err", uerr)
		}
	}()
	// Another worker may have finished it between the look and the lock.
	if m, ok, err := in.complete(ctx, src, path, info); err != nil || ok {
		if ok {
			in.skipped(m, true)
		}
		return m.Rows, ok, err
	}
	limit := 0
	if src.Limit > 0 {
		limit = src.Limit - used
	}
	// Rows bad in an earlier read (a file cut short while it was written)
	// may be good now: this read records the file's bad rows afresh.
	if err := in.st.ForgetIngestErrors(ctx, in.spec.Rel(path)); err != nil {
		return 0, false, err
	}
	st, err := in.read(ctx, src, path, limit)
	if err != nil {
		return 0, false, err
	}
	// Complete only now: a worker killed mid-file leaves no entry, and the
	// next one reads the file again (inserting only what is missing).
	f := store.SourceFile{Partition: src.Partition, Path: in.spec.Rel(path), Size: info.Size, ModTime: info.ModTime,
		Fingerprint: info.Fingerprint, Rows: st.Good, Bad: st.Bad, Complete: true}
	if err := in.st.PutSourceFile(ctx, f); err != nil {
		return 0, false, err
	}
	return st.Good, true, nil
}

// complete returns path's manifest entry if it says the file, as it is
// now, is fully in the store.
func (in *Ingester) complete(ctx context.Context, src job.Source, path string, info source.FileInfo) (store.SourceFile, bool, error) {
	m, ok, err := in.st.SourceFile(ctx, src.Partition, in.spec.Rel(path))
	if err != nil || !ok {
		return store.SourceFile{}, false, err
	}
	same := m.Complete && m.Size == info.Size && m.ModTime.Equal(info.ModTime) && m.Fingerprint == info.Fingerprint
	return m, same, nil
}

func (in *Ingester) skipped(m store.SourceFile, byOther bool) {
	in.stats.Read += m.Rows + m.Bad
	in.stats.Unread += m.Rows + m.Bad
	in.stats.Bad += m.Bad
	in.stats.Copies += m.Rows * (in.perPrompt(m.Partition) - 1)
	if byOther {
		in.stats.ByOthers++
	} else {
		in.stats.Skipped++
	}
}

// read streams one file into the store in batches.
func (in *Ingester) read(ctx context.Context, src job.Source, path string, limit int) (source.Stats, error) {
	spec := in.spec
	batch := make([]store.NewSample, 0, ingestBatch)
	var bad []store.IngestError
	flush := func() error {
		if len(batch) > 0 {
			n, err := in.st.Ingest(ctx, batch)
			if err != nil {
				return storeError{err}
			}
			in.stats.Inserted += n
			batch = batch[:0]
			if n > 0 && in.wake != nil {
				in.wake()
			}
		}
		if len(bad) > 0 {
			if err := in.st.AddIngestErrors(ctx, bad); err != nil {
				return storeError{err}
			}
			bad = bad[:0]
		}
		return nil
	}
	emit := func(s source.Sample) error {
		if s.Copy == 0 {
			in.stats.Read++ // a row, however many samples it makes
		} else {
			in.stats.Copies++
		}
		batch = append(batch, store.NewSample{
			ID: s.ID, Partition: s.Partition, Body: s.Body, PromptTokens: s.PromptTokens, Origin: s.Origin,
			Lane: spec.LaneFor(s.Partition, s.PromptTokens),
		})
		if len(batch) >= ingestBatch {
			return flush()
		}
		return nil
	}
	onBad := func(b source.BadRow) error {
		in.stats.Read++
		in.stats.Bad++
		bad = append(bad, store.IngestError{Partition: b.Partition, Origin: b.Origin, Field: b.Field, Reason: b.Reason})
		if len(bad) >= ingestBatch {
			return flush()
		}
		return nil
	}
	st, err := source.Options{OriginName: in.spec.Rel(path)}.ReadFile(ctx, src, path, limit, emit, onBad)
	if err != nil {
		return st, in.sourceError(ctx, path, err)
	}
	return st, flush()
}
