package export

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/parquet-go/parquet-go"
)

// checkRecords renders every store record the way the export did, through
// the export's own sinks, into checkers that compare each line (each
// Parquet row) with the listed files, and returns the records compared
// and the first mismatch of each file, and the written rows' input hashes
// (exporter.inputs).
func checkRecords(ctx context.Context, st Store, dir, name string, files []ManifestFile, o Options, since time.Time) (int, []Problem, map[string]string, error) {
	listed := map[string]bool{}
	for _, f := range files {
		listed[f.Path] = true
	}
	var lines []*lineChecker
	create := func(final string) (*atomicFile, error) {
		c, err := openLineChecker(final, relPath(dir, final), listed[relPath(dir, final)])
		if err != nil {
			return nil, err
		}
		lines = append(lines, c)
		return &atomicFile{final: final, dst: c, sum: sha256.New()}, nil
	}
	defer func() {
		for _, c := range lines {
			c.close()
		}
	}()
	want := map[string]bool{}
	for _, f := range Formats {
		for _, base := range formatFiles(name, f) {
			want[f] = want[f] || listed[base]
		}
	}
	pqWanted := want[FormatParquet]
	delete(want, FormatParquet)
	w, err := openWriters(create, dir, name, want, o)
	if err != nil {
		return 0, nil, nil, err
	}
	var pqs []*parquetChecker
	if pqWanted {
		if w.pq, pqs, err = parquetCheckers(dir, name, listed, o); err != nil {
			return 0, nil, nil, err
		}
		for _, c := range pqs {
			if c.f != nil {
				defer c.f.Close()
			}
		}
		w.list = append(w.list, w.pq)
	}
	x := &exporter{w: w, o: o, seen: serverTally{}}
	if !since.IsZero() {
		x.hold = func(r *record) bool {
			if !r.row.FinishedAt.After(since) {
				return false
			}
			for _, id := range r.rowIDs() {
				skipNewer(w, id)
				x.heldInput(id)
			}
			return true
		}
	}
	if err := x.stream(ctx, st); err != nil {
		return 0, nil, nil, err
	}
	var out []Problem
	for _, pq := range pqs {
		_ = pq.Close() // compares the rows left in the file
		out = append(out, pq.problems()...)
	}
	for _, c := range lines {
		out = append(out, c.finish()...)
	}
	return x.sum.Done + x.sum.Rejected + x.sum.Dead + x.sum.BadRows, out, x.inputs, nil
}

// parquetCheckers is the Parquet sink under Verify: checkers of the
// Parquet file and, with token ids, of its no-token-ids file (checked as
// empty when the manifest does not list it).
func parquetCheckers(dir, name string, listed map[string]bool, o Options) (*parquetSink, []*parquetChecker, error) {
	turns := o.TokenIDs && o.TokenRows == TokenRowsTurn
	train, noIDs := plainRowsFile, noIDsRowsFile
	switch {
	case turns:
		train, noIDs = turnRowsFile, turnNoIDsRowsFile
	case o.TokenIDs:
		train = tokenRowsFile
	}
	pq, err := openParquetChecker(TrainingFile(dir, name, FormatParquet), relPath(dir, TrainingFile(dir, name, FormatParquet)), train)
	if err != nil {
		return nil, nil, err
	}
	s := &parquetSink{out: &output{format: FormatParquet}, rows: pq, full: o.Metadata == MetadataFull}
	checkers := []*parquetChecker{pq}
	// side is the checker of a side file, checked as empty when the
	// manifest does not list it.
	side := func(base string, kind int) (*parquetChecker, error) {
		if !listed[base] {
			return &parquetChecker{path: base, bad: &Problem{}}, nil
		}
		c, err := openParquetChecker(filepath.Join(dir, base), base, kind)
		if err != nil {
			for _, c := range checkers {
				if c.f != nil {
					_ = c.f.Close() // read only
				}
			}
			return nil, err
		}
		return c, nil
	}
	if o.TokenIDs {
		c, err := side(name+noIDsParquet, noIDs)
		if err != nil {
			return nil, nil, err
		}
		s.noIDs, s.noIDsRows, checkers = &output{format: FormatParquetNoTokenIDs}, c, append(checkers, c)
	}
	if !o.TrainTruncated {
		c, err := side(name+truncParquet, train)
		if err != nil {
			return nil, nil, err
		}
		s.trunc, s.truncRows, checkers = &output{format: FormatParquetTruncated}, c, append(checkers, c)
	}
	return s, checkers, nil
}

// skipNewer passes over the line (row) of a sample that finished after the
// export began, in every file, when the file has it next.
func skipNewer(w *writers, id string) {
	for _, s := range w.list {
		switch s := s.(type) {
		case *batchSink:
			a := s.done.af.dst.(*lineChecker).skip(id)
			b := s.errs.af.dst.(*lineChecker).skip(id)
			if a || b {
				s.n++ // the batch_req_<n> the file gave it
			}
		case *parquetSink:
			s.rows.(*parquetChecker).skip(id)
			for _, side := range []rowWriter{s.noIDsRows, s.truncRows} {
				if side != nil {
					side.(*parquetChecker).skip(id)
				}
			}
		default:
			for _, o := range s.files() {
				o.af.dst.(*lineChecker).skip(id)
			}
		}
	}
}

// lineChecker is the destination of a JSONL sink under Verify: each line
// the sink writes is compared with the file's next line. Only the first
// mismatch is kept: after a missing or added line every later one differs.
type lineChecker struct {
	path  string
	f     *os.File
	r     *bufio.Reader
	line  int    // lines compared so far
	ahead []byte // a line read by skip and not consumed
	bad   *Problem
}

// openLineChecker opens path; a file the manifest does not list is
// checked as empty (its mismatches are the manifest's, reported once).
func openLineChecker(path, rel string, listed bool) (*lineChecker, error) {
	c := &lineChecker{path: rel}
	if !listed {
		c.bad = &Problem{} // nothing to compare; not reported again
		return c, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		c.bad = &Problem{} // reported by checkFile
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	c.f, c.r = f, bufio.NewReaderSize(f, 256<<10)
	return c, nil
}

func (c *lineChecker) close() {
	if c.f != nil {
		_ = c.f.Close() // read only
	}
}

// next is the file's next line, nil at its end.
func (c *lineChecker) next() ([]byte, error) {
	if c.ahead != nil {
		l := c.ahead
		c.ahead = nil
		return l, nil
	}
	l, err := c.r.ReadBytes('\n')
	if errors.Is(err, io.EOF) {
		if len(l) == 0 {
			return nil, nil
		}
		return l, nil
	}
	return l, err
}

// Write takes one line as the export renders it (json.Encoder writes each
// value with its newline in one call).
func (c *lineChecker) Write(want []byte) (int, error) {
	if c.bad != nil {
		return len(want), nil
	}
	c.line++
	got, err := c.next()
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", c.path, err)
	}
	if !bytes.Equal(got, want) {
		c.bad = lineMismatch(c.path, c.line, got, want)
	}
	return len(want), nil
}

// skip consumes the file's next line when it is id's; true when it was.
func (c *lineChecker) skip(id string) bool {
	if c.bad != nil || c.r == nil {
		return false
	}
	if c.ahead == nil {
		l, err := c.next()
		if err != nil || l == nil {
			return false
		}
		c.ahead = l
	}
	if lineID(c.ahead) != id {
		return false
	}
	c.ahead = nil
	c.line++
	return true
}

// finish reports the first mismatch, or a line the store has no record for.
func (c *lineChecker) finish() []Problem {
	if c.bad != nil {
		if c.bad.Path == "" {
			return nil
		}
		return []Problem{*c.bad}
	}
	extra, err := c.next()
	switch {
	case err != nil:
		return []Problem{{Path: c.path, What: err.Error()}}
	case extra != nil:
		return []Problem{{Path: c.path, Line: c.line + 1, ID: lineID(extra),
			What: "the store has no finished record for this line (a line added, or the store changed since the export)"}}
	}
	return nil
}

// lineMismatch describes the first difference between a file's line and
// the store's record at the same place.
func lineMismatch(path string, n int, got, want []byte) *Problem {
	gotID, wantID := lineID(got), lineID(want)
	p := &Problem{Path: path, Line: n, ID: gotID}
	switch {
	case got == nil:
		p.ID = wantID
		p.What = fmt.Sprintf("the file ends after line %d; the store's next record is %s (lines missing at the end)", n-1, wantID)
	case !bytes.HasSuffix(got, []byte("\n")):
		p.ID = wantID
		p.What = fmt.Sprintf("cut short: the file ends %d bytes into this line, which is the store's record %s", len(got), wantID)
	case gotID != wantID:
		p.What = fmt.Sprintf("the store's record here is %s (a line missing, added or moved)", wantID)
	default:
		at := firstDiff(got, want)
		p.What = fmt.Sprintf("differs from the store's current answer at byte %d: the file has '%s', the store '%s'",
			at+1, excerpt(got, at), excerpt(want, at))
	}
	return p
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// excerpt is up to 40 bytes of b around at.
func excerpt(b []byte, at int) string {
	lo, hi := max(at-16, 0), min(at+24, len(b))
	return string(bytes.TrimRight(b[lo:hi], "\n"))
}

// lineID is the sample id of an exported line: custom_id in the
// openai-batch files, id elsewhere; "" when the line is not JSON.
func lineID(l []byte) string {
	var v struct {
		ID       string `json:"id"`
		CustomID string `json:"custom_id"`
	}
	if json.Unmarshal(l, &v) != nil {
		return ""
	}
	if v.CustomID != "" {
		return v.CustomID
	}
	return v.ID
}

// parquetChecker is the row writer of the Parquet sink under Verify: it
// reads the file's rows one by one and compares each with the row the
// store renders. It implements rowWriter.
type parquetChecker struct {
	path   string
	f      *os.File
	plain  *parquet.GenericReader[ParquetRow]
	tokens *parquet.GenericReader[ParquetTokenRow]
	// noIDs and turnNoIDs read a no-token-ids file in its own schema: read
	// as a token row, parquet-go filled input_ids from another column.
	noIDs     *parquet.GenericReader[ParquetNoIDsRow]
	turns     *parquet.GenericReader[ParquetTurnRow]
	turnNoIDs *parquet.GenericReader[ParquetTurnNoIDsRow]
	row       int // rows compared so far
	ahead     *ParquetTurnRow
	bad       *Problem
}

// Row types a parquetChecker reads.
const (
	plainRowsFile = iota
	tokenRowsFile
	noIDsRowsFile
	turnRowsFile
	turnNoIDsRowsFile
)

func openParquetChecker(path, rel string, kind int) (*parquetChecker, error) {
	c := &parquetChecker{path: rel}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	pf, err := parquet.OpenFile(f, info.Size())
	if err != nil {
		f.Close()
		c.bad = &Problem{} // an unreadable file is reported by checkFile
		return c, nil
	}
	c.f = f
	switch kind {
	case turnRowsFile:
		c.turns = parquet.NewGenericReader[ParquetTurnRow](pf)
	case turnNoIDsRowsFile:
		c.turnNoIDs = parquet.NewGenericReader[ParquetTurnNoIDsRow](pf)
	case tokenRowsFile:
		c.tokens = parquet.NewGenericReader[ParquetTokenRow](pf)
	case noIDsRowsFile:
		c.noIDs = parquet.NewGenericReader[ParquetNoIDsRow](pf)
	default:
		c.plain = parquet.NewGenericReader[ParquetRow](pf)
	}
	return c, nil
}

// next reads the file's next row; nil at its end.
func (c *parquetChecker) next() (*ParquetTurnRow, error) {
	if c.ahead != nil {
		r := c.ahead
		c.ahead = nil
		return r, nil
	}
	var r ParquetTurnRow
	var n int
	var err error
	switch {
	case c.turns != nil:
		buf := make([]ParquetTurnRow, 1)
		n, err = c.turns.Read(buf)
		r = buf[0]
	case c.tokens != nil:
		buf := make([]ParquetTokenRow, 1)
		n, err = c.tokens.Read(buf)
		r.ParquetRow, r.InputIDs, r.LossMask, r.TokenIDs = buf[0].ParquetRow, buf[0].InputIDs, buf[0].LossMask, buf[0].TokenIDs
	case c.noIDs != nil:
		buf := make([]ParquetNoIDsRow, 1)
		n, err = c.noIDs.Read(buf)
		r.ParquetRow, r.TokenIDs = buf[0].ParquetRow, buf[0].TokenIDs
	case c.turnNoIDs != nil:
		buf := make([]ParquetTurnNoIDsRow, 1)
		n, err = c.turnNoIDs.Read(buf)
		r.ParquetRow, r.ConversationID, r.Turn, r.TokenIDs = buf[0].ParquetRow, buf[0].ConversationID, buf[0].Turn, buf[0].TokenIDs
	default:
		buf := make([]ParquetRow, 1)
		n, err = c.plain.Read(buf)
		r.ParquetRow = buf[0]
	}
	if n == 1 {
		return &r, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return nil, nil
	}
	return nil, err
}

func (c *parquetChecker) write(r *record, row ParquetRow) error {
	if c.bad != nil {
		return nil
	}
	want := ParquetTurnRow{ParquetRow: row}
	if c.tokens != nil || c.turns != nil || c.noIDs != nil || c.turnNoIDs != nil {
		t := r.tokens()
		want.InputIDs, want.LossMask, want.TokenIDs = t.InputIDs, t.LossMask, optional(t.Missing)
	}
	if k := r.turnFields(); (c.turns != nil || c.turnNoIDs != nil) && k != nil {
		want.ConversationID, want.Turn = k.ConversationID, int64(k.Turn)
	}
	c.row++
	got, err := c.next()
	if err != nil {
		return fmt.Errorf("read %s: %w", c.path, err)
	}
	switch {
	case got == nil:
		c.bad = &Problem{Path: c.path, Line: c.row, ID: row.ID, What: fmt.Sprintf("the file ends after row %d; the store's next record is %s (rows missing at the end)", c.row-1, row.ID)}
	case got.ID != row.ID:
		c.bad = &Problem{Path: c.path, Line: c.row, ID: got.ID, What: fmt.Sprintf("the store's record here is %s (a row missing, added or moved)", row.ID)}
	default:
		if field := firstField(normalise(*got), normalise(want)); field != "" {
			c.bad = &Problem{Path: c.path, Line: c.row, ID: got.ID, What: "column " + field + " differs from the store's current answer"}
		}
	}
	return nil
}

func (c *parquetChecker) skip(id string) {
	if c.bad != nil || c.f == nil {
		return
	}
	if c.ahead == nil {
		r, err := c.next()
		if err != nil || r == nil {
			return
		}
		c.ahead = r
	}
	if c.ahead.ID == id {
		c.ahead = nil
		c.row++
	}
}

func (c *parquetChecker) Flush() error { return nil }

// Close looks for rows the store has no record for.
func (c *parquetChecker) Close() error {
	if c.bad != nil || c.f == nil {
		return nil
	}
	got, err := c.next()
	if err != nil {
		c.bad = &Problem{Path: c.path, What: err.Error()}
	} else if got != nil {
		c.bad = &Problem{Path: c.path, Line: c.row + 1, ID: got.ID,
			What: "the store has no finished record for this row (a row added, or the store changed since the export)"}
	}
	return nil
}

func (c *parquetChecker) problems() []Problem {
	if c.bad == nil || c.bad.Path == "" {
		return nil
	}
	return []Problem{*c.bad}
}

// normalise makes empty lists nil and pointers to a zero value nil:
// parquet-go reads an empty list back as nil and, in the embedded row of
// ParquetTokenRow, a null as a pointer to the zero value. (The export
// writes no pointer to "" and a seed of 0 is the one value this blurs.)
func normalise(r ParquetTurnRow) ParquetTurnRow {
	zeroNil(reflect.ValueOf(&r).Elem())
	return r
}

func zeroNil(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() && v.Elem().IsZero() {
			v.SetZero()
		}
	case reflect.Slice:
		if v.Len() == 0 {
			v.SetZero()
		}
		for i := range v.Len() {
			zeroNil(v.Index(i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			zeroNil(v.Field(i))
		}
	}
}

// firstField is the Parquet column name of the first field where a and b
// differ, "" when they are equal.
func firstField(a, b ParquetTurnRow) string {
	if reflect.DeepEqual(a, b) {
		return ""
	}
	va, vb := reflect.ValueOf(a.ParquetRow), reflect.ValueOf(b.ParquetRow)
	for i := range va.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return parquetName(va.Type().Field(i))
		}
	}
	vt, wt := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := 1; i < vt.NumField(); i++ {
		if !reflect.DeepEqual(vt.Field(i).Interface(), wt.Field(i).Interface()) {
			return parquetName(vt.Type().Field(i))
		}
	}
	return "?"
}

func parquetName(f reflect.StructField) string {
	tag := f.Tag.Get("parquet")
	if i := slices.Index([]byte(tag), ','); i >= 0 {
		tag = tag[:i]
	}
	return tag
}

// compile-time check: the Parquet checker stands where the writer does.
var _ rowWriter = (*parquetChecker)(nil)
