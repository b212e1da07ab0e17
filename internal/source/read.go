package source

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/job"
)

// DefaultMaxLineBytes is the longest JSONL line read as a row.
const DefaultMaxLineBytes = 64 << 20

// Options tunes reading. The zero value uses the defaults.
type Options struct {
	// MaxLineBytes caps one JSONL line (without its newline); a longer line
	// is reported as a BadRow and skipped without being buffered whole.
	MaxLineBytes int
	// OriginName names the file in origins ("name:line"); the path when
	// empty. Ingest names files relative to the job file, so a job folder
	// moved with its store keeps its origins.
	OriginName string
}

// Stats counts what one Read saw.
type Stats struct {
	Files int // files opened, empty ones included
	Rows  int // rows read (non-blank JSONL lines, Parquet rows)
	Good  int // rows emitted as samples
	Bad   int // rows reported as BadRow
}

// Read streams every file of src and calls emit per good row and bad per
// malformed describes a JSON error with its byte offset; offset is used
// when the error carries none (a truncated value ends at the input's end). row, in file order. Relative paths resolve against baseDir. It
// stops after src.Limit good rows (0 = all), at the first error returned
// by emit or bad, or when ctx is done.
func Read(ctx context.Context, src job.Source, baseDir string, emit func(Sample) error, bad func(BadRow) error) (Stats, error) {
	return Options{}.Read(ctx, src, baseDir, emit, bad)
}

// Read is the package-level Read with these options.
func (o Options) Read(ctx context.Context, src job.Source, baseDir string, emit func(Sample) error, bad func(BadRow) error) (Stats, error) {
	if err := checkMapping(src); err != nil {
		return Stats{}, err
	}
	files, err := Files(src, baseDir)
	if err != nil {
		return Stats{}, err
	}
	var total Stats
	for _, f := range files {
		limit := 0
		if src.Limit > 0 {
			limit = src.Limit - total.Good
		}
		st, err := o.ReadFile(ctx, src, f, limit, emit, bad)
		total.Files += st.Files
		total.Rows += st.Rows
		total.Good += st.Good
		total.Bad += st.Bad
		if err != nil {
			return total, err
		}
		if src.Limit > 0 && total.Good >= src.Limit {
			return total, nil
		}
	}
	return total, nil
}

func checkMapping(src job.Source) error {
	n := 0
	for _, f := range []string{src.Conversations, src.Messages, src.Prompt} {
		if f != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("source %s: map exactly one of conversations, messages or prompt (got %d)", src.Partition, n)
	}
	return nil
}

// ReadFile streams one file of src (one of Files(src, ...)), calling emit per
// good row and bad per malformed row, and stops after limit good rows
// (0 = all). It lets a caller skip files it already ingested and record
// each file's outcome.
func (o Options) ReadFile(ctx context.Context, src job.Source, path string, limit int, emit func(Sample) error, bad func(BadRow) error) (Stats, error) {
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
	if err := checkMapping(src); err != nil {
		return Stats{}, err
	}
	src.Limit = limit
	r := &reader{
		ctx:  ctx,
		src:  src,
		opts: o,
		m:    newMapper(src),
		emit: emit,
		bad:  bad,
	}
	format, err := fileFormat(src.Format, path)
	if err == nil {
		r.stats.Files++
		if format == "parquet" {
			err = r.parquetFile(path)
		} else {
			err = r.jsonlFile(path)
		}
	}
	if errors.Is(err, errLimit) {
		return r.stats, nil
	}
	if err != nil {
		return r.stats, fmt.Errorf("source %s: %w", src.Partition, err)
	}
	return r.stats, nil
}

// Files resolves src.Path (a file, a glob or a directory) against baseDir
// to the sorted list of files Read will open. A path that does not exist,
// a glob without matches and a directory without data files are errors.
func Files(src job.Source, baseDir string) ([]string, error) {
	p := src.Path
	if p == "" {
		return nil, fmt.Errorf("source %s: no path", src.Partition)
	}
	if !filepath.IsAbs(p) && baseDir != "" {
		p = filepath.Join(baseDir, p)
	}
	if strings.ContainsAny(src.Path, "*?[") {
		matches, err := filepath.Glob(p)
		if err != nil {
			return nil, fmt.Errorf("source %s path %s: %w", src.Partition, p, err)
		}
		var files []string
		for _, m := range matches {
			if st, err := os.Stat(m); err == nil && st.Mode().IsRegular() {
				files = append(files, m)
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("source %s path %s: no files match", src.Partition, p)
		}
		slices.Sort(files)
		return files, nil
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", src.Partition, err)
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", src.Partition, err)
	}
	var files []string
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && (strings.HasSuffix(n, ".jsonl") || strings.HasSuffix(n, ".jsonl.gz") || strings.HasSuffix(n, ".parquet")) {
			files = append(files, filepath.Join(p, n))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("source %s path %s: no *.jsonl, *.jsonl.gz or *.parquet files in directory", src.Partition, p)
	}
	slices.Sort(files) // ReadDir sorts already; keep the contract explicit
	return files, nil
}

func fileFormat(format, path string) (string, error) {
	switch format {
	case "jsonl", "parquet":
		return format, nil
	case "":
	default:
		return "", fmt.Errorf("format %q: want jsonl or parquet", format)
	}
	switch {
	case strings.HasSuffix(path, ".parquet"):
		return "parquet", nil
	case strings.HasSuffix(path, ".jsonl"), strings.HasSuffix(path, ".jsonl.gz"):
		return "jsonl", nil
	}
	return "", fmt.Errorf("%s: cannot tell the format from the name; set format: jsonl or parquet", path)
}

// errLimit ends reading once src.Limit good rows were emitted.
var errLimit = errors.New("limit reached")

type reader struct {
	ctx   context.Context
	src   job.Source
	opts  Options
	m     *mapper
	emit  func(Sample) error
	bad   func(BadRow) error
	stats Stats
	// onRow, when set, sees every decoded row before it is mapped (Inspect).
	onRow func(map[string]any)
}

// row maps one decoded row and hands it to emit or bad.
func (r *reader) row(v map[string]any, origin string) error {
	if r.stats.Rows%256 == 0 {
		if err := r.ctx.Err(); err != nil {
			return err
		}
	}
	r.stats.Rows++
	if r.onRow != nil {
		r.onRow(v)
	}
	s, rerr := r.m.sample(v, origin)
	if rerr != nil {
		return r.badRow(origin, rerr.field, rerr.reason)
	}
	r.stats.Good++
	for j := range max(r.src.SamplesPerPrompt, 1) {
		if err := r.emit(copyOf(s, j, r.src.SamplesPerPrompt)); err != nil {
			return fmt.Errorf("%s: %w", origin, err)
		}
	}
	if r.src.Limit > 0 && r.stats.Good >= r.src.Limit {
		return errLimit
	}
	return nil
}

func (r *reader) badRow(origin, field, reason string) error {
	r.stats.Bad++
	if err := r.bad(BadRow{Partition: r.src.Partition, Origin: origin, Field: field, Reason: reason}); err != nil {
		return fmt.Errorf("%s: %w", origin, err)
	}
	return nil
}

// errReader remembers the underlying file's error so a decompression error
// can be told apart from an I/O error in messages.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// originName is the file's name in origins.
func (r *reader) originName(path string) string {
	if r.opts.OriginName != "" {
		return r.opts.OriginName
	}
	return path
}

func (r *reader) jsonlFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fr := &errReader{r: f}
	br := bufio.NewReaderSize(fr, 64<<10)
	// Sniff the gzip magic rather than trust the name: format: jsonl may point at a .gz.
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: gzip: %w", path, err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 64<<10)
	}

	lr := &lineReader{br: br, max: r.opts.MaxLineBytes}
	var (
		lineNo int
		dec    decoder
	)
	for {
		line, tooLong, n, err := lr.next()
		if err == io.EOF {
			return nil
		}
		lineNo++
		if err != nil {
			if fr.err != nil {
				return fmt.Errorf("read %s line %d: %w", path, lineNo, fr.err)
			}
			return fmt.Errorf("read %s line %d: corrupt data: %w", path, lineNo, err)
		}
		origin := r.originName(path) + ":" + strconv.Itoa(lineNo)
		if tooLong {
			r.stats.Rows++
			if err := r.badRow(origin, "", fmt.Sprintf("line longer than %d bytes (%d bytes)", r.opts.MaxLineBytes, n)); err != nil {
				return err
			}
			continue
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue // blank lines (often a trailing one) are not rows
		}
		v, reason := dec.object(line)
		if reason != "" {
			r.stats.Rows++
			if err := r.badRow(origin, "", reason); err != nil {
				return err
			}
			continue
		}
		if err := r.row(v, origin); err != nil {
			return err
		}
	}
}

// lineReader reads lines of at most max bytes. A longer line is consumed
// to its end but not buffered, so memory stays at max whatever the input.
type lineReader struct {
	br  *bufio.Reader
	max int
	buf []byte
}

// next returns the next line without its line ending; the slice is valid
// until the next call. For a line longer than max, tooLong is set, line is
// nil and n is its length.
func (lr *lineReader) next() (line []byte, tooLong bool, n int, err error) {
	buf := lr.buf[:0]
	var last []byte
	for first := true; ; first = false {
		chunk, err := lr.br.ReadSlice('\n')
		n += len(chunk)
		last = chunk
		if err == nil && first {
			line = chunk // the whole line sits in bufio's buffer: no copy
		} else if !tooLong {
			if len(buf)+len(chunk) > lr.max+2 { // +2: room for "\r\n"
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
			line = buf
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && n == 0 {
			return nil, false, 0, io.EOF
		}
		if err != nil && err != io.EOF {
			return nil, false, n, err
		}
		break
	}
	if cap(buf) <= 4<<20 {
		lr.buf = buf // keep a grown buffer, but do not pin a huge one
	} else {
		lr.buf = nil
	}
	if tooLong {
		if bytes.HasSuffix(last, []byte("\n")) {
			n--
		}
		return nil, true, n, nil
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) > lr.max {
		return nil, true, len(line), nil
	}
	return line, false, len(line), nil
}

// decoder decodes one JSONL line into an object, keeping numbers exact.
type decoder struct {
	r bytes.Reader
}

func (d *decoder) object(line []byte) (map[string]any, string) {
	if reason := invalidText(line); reason != "" {
		return nil, reason
	}
	d.r.Reset(line)
	dec := json.NewDecoder(&d.r)
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, malformed(err, int64(len(line)))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Sprintf("malformed JSON at byte %d: data after the object", dec.InputOffset())
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Sprintf("row: want object, got %s", jsonType(v))
	}
	return obj, ""
}

func malformed(err error, offset int64) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		offset = se.Offset
	}
	if err == io.ErrUnexpectedEOF {
		err = errors.New("unexpected end of line")
	}
	return fmt.Sprintf("malformed JSON at byte %d: %v", offset, err)
}

// parquetBatch is how many rows one GenericReader.Read fills.
const parquetBatch = 64

func (r *reader) parquetFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		// Unlike an empty JSONL file, 0 bytes is not a Parquet file with no
		// rows (that has a footer): it is a file cut short, like a truncated one.
		return fmt.Errorf("open parquet %s: empty file (0 bytes): not a Parquet file, which ends with a footer even with no rows", path)
	}
	pf, err := parquet.OpenFile(f, st.Size(), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return fmt.Errorf("open parquet %s: %w", path, err)
	}
	schema := pf.Schema()
	if err := checkColumns(schema, r.src); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	pr := parquet.NewGenericReader[map[string]any](pf, schema)
	defer pr.Close()
	rows := make([]map[string]any, parquetBatch)
	for i := range rows {
		rows[i] = map[string]any{} // the reader panics on nil maps
	}
	index := 0
	for {
		for _, m := range rows {
			clear(m)
		}
		n, err := pr.Read(rows)
		for _, m := range rows[:n] {
			if rerr := r.parquetRow(m, r.originName(path)+":row "+strconv.Itoa(index)); rerr != nil {
				return rerr
			}
			index++
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read parquet %s row %d: %w", path, index, err)
		}
	}
}

// parquetRow is row for a Parquet row, whose strings are checked first:
// the reader does not validate them.
func (r *reader) parquetRow(m map[string]any, origin string) error {
	if field, reason := invalidString(m, ""); reason != "" {
		r.stats.Rows++
		return r.badRow(origin, field, reason)
	}
	return r.row(m, origin)
}

// checkColumns fails early when a mapped field is not a top-level column:
// that is a mistake in the job, not in one row.
func checkColumns(schema *parquet.Schema, src job.Source) error {
	have := map[string]bool{}
	var names []string
	for _, f := range schema.Fields() {
		have[f.Name()] = true
		names = append(names, f.Name())
	}
	for _, c := range []string{src.Conversations, src.Messages, src.Prompt, src.SystemField, src.Tools, src.ID} {
		if c != "" && !have[c] {
			return fmt.Errorf("no column %q (columns: %s)", c, strings.Join(names, ", "))
		}
	}
	return nil
}
