package source

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/job"
)

// Inspection is what a look at a source's files found, without ingesting.
type Inspection struct {
	Files []string
	// Rows and Good count the first rows read (up to the rows asked for);
	// Bad holds the reasons of those that cannot become samples.
	Rows, Good int
	Bad        []BadRow
	// Missing lists the mapped fields found in none of the rows read (JSONL)
	// or not a column (Parquet): a mistake in the job, not in one row.
	Missing []MissingField
	// Hint is the likely fix when every row read is bad because a mapped
	// field holds another shape ("field messages holds a message list: use
	// messages: messages"); "" otherwise.
	Hint HintedOption
}

// HintedOption is a source option whose mapped field fits another option.
type HintedOption struct {
	Option string // the option set in the job: prompt, messages, conversations
	Field  string
	Fits   string // the option the field's values fit
}

func (h HintedOption) String() string {
	if h.Fits == "" {
		return ""
	}
	return fmt.Sprintf("field %s holds %s: use %s: %s", h.Field, shapeWords[h.Fits], h.Fits, h.Field)
}

var shapeWords = map[string]string{
	"prompt":        "a string",
	"messages":      "a message list",
	"conversations": "a ShareGPT conversation (from/value turns)",
}

// MissingField is a mapped field the source's rows do not have.
type MissingField struct {
	Option string // the source option naming it: prompt, id, tools, ...
	Field  string
	Seen   []string // the fields the rows have instead
}

func (m MissingField) String() string {
	return fmt.Sprintf("%s: field %q is in none of the rows read (they have: %s)", m.Option, m.Field, strings.Join(m.Seen, ", "))
}

var errEnough = errors.New("enough rows")

// Inspect resolves src to its files, checks each can be opened, and reads
// the first rows (at most rows) through the job's field mapping, so a typo
// in a path or a field name shows before a run rather than as a dead
// letter per row.
func Inspect(ctx context.Context, src job.Source, baseDir string, rows int) (Inspection, error) {
	var in Inspection
	files, err := Files(src, baseDir)
	if err != nil {
		return in, err
	}
	in.Files = files
	for _, f := range files {
		h, err := os.Open(f)
		if err != nil {
			return in, fmt.Errorf("source %s: %w", src.Partition, err)
		}
		h.Close()
	}

	seen := newFieldsSeen(src)
	if format, _ := fileFormat(src.Format, files[0]); format == "parquet" {
		names, err := parquetColumns(files[0])
		if err != nil {
			return in, fmt.Errorf("source %s: %w", src.Partition, err)
		}
		if seen.note(names); len(names) > 0 {
			if in.Missing = seen.missing(); len(in.Missing) > 0 {
				return in, nil // the reader would refuse the file as a whole
			}
		}
	}
	if err := inspectRows(ctx, src, files, rows, &in, seen); err != nil {
		return in, fmt.Errorf("source %s: %w", src.Partition, err)
	}
	in.Good = in.Rows - len(in.Bad)
	if in.Good > 0 {
		in.Hint = HintedOption{} // some rows fit the mapping: the bad ones are the rows' fault
	}
	if len(seen.order) > 0 && len(in.Missing) == 0 { // no row at all: nothing to judge the mapping by
		in.Missing = seen.missing()
	}
	return in, nil
}

// inspectRows reads the first rows of files through src's mapping into in,
// noting every row's fields in seen.
func inspectRows(ctx context.Context, src job.Source, files []string, rows int, in *Inspection, seen *fieldsSeen) error {
	count := func() error {
		if in.Rows++; in.Rows >= rows {
			return errEnough
		}
		return nil
	}
	probe := src
	probe.Limit = 0
	r := &reader{ctx: ctx, src: probe, opts: Options{MaxLineBytes: DefaultMaxLineBytes}, m: newMapper(probe),
		emit: func(Sample) error { return count() },
		bad: func(b BadRow) error {
			in.Bad = append(in.Bad, b)
			return count()
		},
	}
	r.onRow = func(row map[string]any) {
		if in.Hint.Fits == "" {
			in.Hint = mappingHint(src, row)
		}
		keys := make([]string, 0, len(row))
		for k := range row {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		seen.note(keys)
	}
	for _, f := range files {
		format, err := fileFormat(src.Format, f)
		if err != nil {
			return err
		}
		if format == "parquet" {
			err = r.parquetFile(f)
		} else {
			err = r.jsonlFile(f)
		}
		if errors.Is(err, errEnough) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fieldsSeen is the fields the rows read have, in first-seen order, and
// the fields src maps.
type fieldsSeen struct {
	mapped []struct{ option, field string }
	seen   map[string]bool
	order  []string
}

func newFieldsSeen(src job.Source) *fieldsSeen {
	return &fieldsSeen{seen: map[string]bool{}, mapped: []struct{ option, field string }{
		{"conversations", src.Conversations}, {"messages", src.Messages}, {"prompt", src.Prompt},
		{"system_field", src.SystemField}, {"tools", src.Tools}, {"id", src.ID},
	}}
}

func (s *fieldsSeen) note(keys []string) {
	for _, k := range keys {
		if !s.seen[k] {
			s.seen[k] = true
			s.order = append(s.order, k)
		}
	}
}

// missing is the mapped fields no row had.
func (s *fieldsSeen) missing() []MissingField {
	var out []MissingField
	for _, m := range s.mapped {
		if m.field != "" && !s.seen[m.field] {
			out = append(out, MissingField{Option: m.option, Field: m.field, Seen: s.order})
		}
	}
	return out
}

// parquetColumns returns the top-level column names of a Parquet file.
func parquetColumns(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() == 0 {
		return nil, nil
	}
	pf, err := parquet.OpenFile(f, st.Size(), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return nil, fmt.Errorf("open parquet %s: %w", path, err)
	}
	var names []string
	for _, fl := range pf.Schema().Fields() {
		names = append(names, fl.Name())
	}
	return names, nil
}

// mappingHint names the option that fits a mapped field whose value in row
// has another shape (a message list mapped with prompt:, a string with
// messages:), or nothing when every mapped field fits its option.
func mappingHint(src job.Source, row map[string]any) HintedOption {
	for _, o := range []struct{ option, field string }{
		{"prompt", src.Prompt}, {"messages", src.Messages}, {"conversations", src.Conversations},
	} {
		v, ok := row[o.field]
		if o.field == "" || !ok {
			continue
		}
		if fits := fittingOption(v); fits != "" && fits != o.option {
			return HintedOption{Option: o.option, Field: o.field, Fits: fits}
		}
	}
	return HintedOption{}
}

// fittingOption is the mapping option a field's value fits by its shape:
// a string is a prompt, a list of role turns messages, a list of from
// turns a ShareGPT conversation; "" when the shape says nothing.
func fittingOption(v any) string {
	switch x := v.(type) {
	case string:
		return "prompt"
	case []any:
		if len(x) == 0 {
			return ""
		}
		turn, ok := x[0].(map[string]any)
		if !ok {
			return ""
		}
		if _, ok := turn["role"]; ok {
			return "messages"
		}
		if _, ok := turn["from"]; ok {
			return "conversations"
		}
	}
	return ""
}
