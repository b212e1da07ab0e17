package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/store"
)

// ErrMismatch says an export's files are not what its manifest and the
// store say they are; the Report names each file and the first mismatch.
var ErrMismatch = errors.New("export does not verify")

// Problem is one mismatch: a file (relative to the output directory), the
// line (or Parquet row, from 1) where it shows, the sample id there when
// known, and what differs.
type Problem struct {
	Path string
	Line int
	ID   string
	What string
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.Path)
	if p.Line > 0 {
		fmt.Fprintf(&b, " line %d", p.Line)
	}
	if p.ID != "" {
		fmt.Fprintf(&b, " (%s)", p.ID)
	}
	return b.String() + ": " + p.What
}

// Report is what Verify checked and what it found.
type Report struct {
	Manifest string // the manifest's path
	Files    int    // files the manifest lists, each checked
	Rows     int    // rows of the listed files, counted
	Records  int    // store records compared with the files
	Problems []Problem
	// StaleCaptures are the keys of captured files not of an exported
	// row's input_ids, which the manifest rightly leaves out (regen
	// capture captures those rows again).
	StaleCaptures []string
}

// Err is nil when every check passed, else ErrMismatch wrapped with the
// first problem and how many more there are.
func (r Report) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	more := ""
	if n := len(r.Problems) - 1; n > 0 {
		more = fmt.Sprintf(" (and %d more)", n)
	}
	return fmt.Errorf("%w: %s%s", ErrMismatch, r.Problems[0], more)
}

// ExportSettings are the options an export's records were rendered with,
// kept in the manifest so Verify renders them the same way.
type ExportSettings struct {
	Metadata string `json:"metadata"`
	TokenIDs bool   `json:"token_ids,omitempty"`
	// TrainTruncated: truncated rows are in the training files.
	TrainTruncated bool `json:"train_truncated,omitempty"`
	// TokenRows is "turn" when each training row is one assistant turn
	// (output.token_rows); absent for conversation rows.
	TokenRows string `json:"token_rows,omitempty"`
	// KeepHistoryReasoning: turn rows' earlier answers keep their
	// reasoning (generation.reasoning: keep); only with turn rows.
	KeepHistoryReasoning bool `json:"keep_history_reasoning,omitempty"`
	// Profile is the trainer profile that wrote the files (output.trainer).
	Profile
}

// ManifestPath is where an export into dir writes name's manifest.
func ManifestPath(dir, name string) string { return filepath.Join(dir, name+".manifest.json") }

// Verify checks the export of name in dir: every file its manifest lists
// (present, bytes, SHA-256, rows), no regen-written file left out of the
// manifest, and every record of the training, rejected, dead and batch
// files against the store's current answer, in order. o gives what the
// records were rendered with when the manifest does not say (JobDir,
// EngineOf, and Metadata and TokenIDs for manifests older than the
// "export" field). A mismatch is a Problem in the Report, not an error;
// the error is for what stopped the check (no manifest, a store failure).
func Verify(ctx context.Context, st Store, dir, name string, o Options) (Report, error) {
	return verify(ctx, st, dir, name, o, time.Time{})
}

// verify is Verify; a non-zero since skips the store's records finished
// after it, and the file's line for the same sample when present: the
// check at the end of an export of a running job, whose store moves on.
func verify(ctx context.Context, st Store, dir, name string, o Options, since time.Time) (Report, error) {
	r := Report{Manifest: ManifestPath(dir, name)}
	b, err := os.ReadFile(r.Manifest)
	if err != nil {
		return r, fmt.Errorf("verify: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return r, fmt.Errorf("verify: %s: %w", r.Manifest, err)
	}
	if m.Schema != ManifestSchema {
		return r, fmt.Errorf("verify: %s: schema %q, want %q", r.Manifest, m.Schema, ManifestSchema)
	}
	if m.Export != nil {
		o.Metadata, o.TokenIDs, o.TokenRows = m.Export.Metadata, m.Export.TokenIDs, m.Export.TokenRows
		o.KeepHistoryReasoning = m.Export.KeepHistoryReasoning
		o.TrainTruncated = m.Export.TrainTruncated
		o.Profile = m.Export.Profile
	}
	for _, f := range m.Files {
		r.Files++
		rows, p := checkFile(dir, f)
		r.Rows += rows
		r.Problems = append(r.Problems, p...)
	}
	r.Problems = append(r.Problems, unlisted(dir, name, m.Files)...)
	records, problems, inputs, err := checkRecords(ctx, st, dir, name, m.Files, o, since)
	if err != nil {
		return r, fmt.Errorf("verify: %w", err)
	}
	hidden, stale, err := checkHiddenStates(ctx, dir, name, &m, o, inputs, since)
	if err != nil {
		return r, fmt.Errorf("verify: %w", err)
	}
	r.Records, r.StaleCaptures = records, stale
	r.Problems = append(append(r.Problems, hidden...), problems...)
	return r, nil
}

// rowRules count a listed file's rows by its format. A format without a
// rule (the card) is checked by bytes and SHA-256 alone; a later kind of
// file adds its rule here (captured hidden-state files: their shape from
// the file's header against the manifest's), and Verify checks it with the
// rest.
var rowRules = map[string]func(f *os.File, size int64, lines int) (int, error){
	FormatShareGPT:                countedLines,
	FormatShareGPTNoTokenIDs:      countedLines,
	FormatOpenAIBatch:             countedLines,
	FormatOpenAIBatch + "-errors": countedLines,
	FormatRejected:                countedLines,
	FormatDead:                    countedLines,
	FormatParquet:                 parquetRows,
	FormatParquetNoTokenIDs:       parquetRows,
	FormatShareGPTTruncated:       countedLines,
	FormatParquetTruncated:        parquetRows,
	FormatHiddenSums:              countedLines,
}

func countedLines(_ *os.File, _ int64, lines int) (int, error) { return lines, nil }

// checkFile compares one listed file with its manifest entry: present,
// bytes, SHA-256, and rows by its format's rule.
func checkFile(dir string, f ManifestFile) (int, []Problem) {
	path := filepath.Join(dir, filepath.FromSlash(f.Path))
	bad := func(format string, a ...any) []Problem {
		return []Problem{{Path: f.Path, What: fmt.Sprintf(format, a...)}}
	}
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, bad("listed in the manifest but missing")
	}
	if err != nil {
		return 0, bad("%v", err)
	}
	defer fh.Close()
	h := sha256.New()
	lines := &lineCounter{}
	n, err := io.Copy(io.MultiWriter(h, lines), fh)
	if err != nil {
		return 0, bad("read: %v", err)
	}
	var out []Problem
	if n != f.Bytes {
		out = append(out, bad("%d bytes, the manifest says %d (cut short or grown)", n, f.Bytes)...)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		out = append(out, bad("SHA-256 %s, the manifest says %s (the bytes changed since the export)", sum, f.SHA256)...)
	}
	rule := rowRules[f.Format]
	if rule == nil {
		return 0, out
	}
	rows, err := rule(fh, n, lines.n)
	if err != nil {
		return 0, append(out, bad("read %s: %v", f.Format, err)...)
	}
	if rows != f.Rows {
		out = append(out, bad("%d rows, the manifest says %d", rows, f.Rows)...)
	}
	return rows, out
}

type lineCounter struct{ n int }

func (c *lineCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			c.n++
		}
	}
	return len(p), nil
}

func parquetRows(f *os.File, size int64, _ int) (int, error) {
	pf, err := parquet.OpenFile(f, size)
	if err != nil {
		return 0, err
	}
	return int(pf.NumRows()), nil
}

// unlisted names the files regen writes for name that are in dir but not
// in the manifest: a manifest describes every file regen wrote there.
func unlisted(dir, name string, files []ManifestFile) []Problem {
	var out []Problem
	for _, base := range regenFiles(name) {
		listed := slices.ContainsFunc(files, func(f ManifestFile) bool { return f.Path == base })
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(base))); err == nil && !listed {
			out = append(out, Problem{Path: base, What: "written by regen but not in the manifest"})
		}
	}
	for _, base := range legacyTraining(name) {
		if _, err := os.Stat(filepath.Join(dir, base)); err == nil {
			out = append(out, Problem{Path: base, What: "stale: a training file of an earlier layout (training files are in " + DataDir + "/); regen export moves it"})
		}
	}
	return out
}

// regenFiles are the data file names an export of name writes.
func regenFiles(name string) []string {
	var out []string
	for _, f := range Formats {
		out = append(out, formatFiles(name, f)...)
	}
	return append(out, name+rejectedSuffix, name+deadSuffix, name+hiddenSumsSuffix)
}

// formatFiles are the files one format of name writes, relative to the
// export folder with slashes (as the manifest names them).
func formatFiles(name, format string) []string {
	switch format {
	case FormatShareGPT:
		return []string{DataDir + "/" + name + ".sharegpt.jsonl", name + noIDsSuffix, name + truncSuffix}
	case FormatOpenAIBatch:
		return []string{name + ".openai-batch.jsonl", name + ".errors.jsonl"}
	case FormatParquet:
		return []string{DataDir + "/" + name + ".parquet", name + noIDsParquet, name + truncParquet}
	}
	return nil
}

// ExportedRejects is the number of rejected samples the manifest of the
// last export of name in dir counts, 0 when there is none (a run stopped
// before its export), it cannot be read, or it is an earlier configuration
// generation's (gens are the store's; after --new-config the old export's
// rejects are not this generation's).
func ExportedRejects(dir, name string, gens []store.Generation) int {
	b, err := os.ReadFile(ManifestPath(dir, name))
	if err != nil {
		return 0
	}
	var m struct {
		Fingerprint string `json:"fingerprint"`
		Generation  int    `json:"generation"`
		Totals      Totals `json:"totals"`
	}
	if json.Unmarshal(b, &m) != nil {
		return 0
	}
	// A store without generations exports none (generationFacts): both zero.
	cur, _ := store.Current(gens)
	if m.Generation != cur.N || m.Fingerprint != cur.Fingerprint {
		return 0
	}
	return m.Totals.Rejected
}

// damagedFiles checks the files of the previous export of name in dir
// against its manifest (bytes and SHA-256) before an export replaces them,
// so a damaged file is reported, not silently overwritten: one warning per
// file that no longer matches.
func damagedFiles(dir, name string) []string {
	b, err := os.ReadFile(ManifestPath(dir, name))
	if err != nil {
		return nil
	}
	var m Manifest
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	var out []string
	for _, f := range m.Files {
		if f.Format == FormatCard {
			continue // a person may take the card over (CardMarker) and edit it
		}
		if _, problems := checkFile(dir, f); len(problems) > 0 {
			out = append(out, fmt.Sprintf("the previous export's %s did not match its manifest (%s); written again from the store", f.Path, problems[0].What))
		}
	}
	return out
}
