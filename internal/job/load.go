package job

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// FieldError is one problem in a job file. Its text is
// "file:line: field: message" ("file:line:col: ..." for decode errors, whose
// column is known); parts that are unknown are left out.
type FieldError struct {
	File  string
	Line  int
	Col   int
	Field string // e.g. lanes[1].max_tokens; "" when the file as a whole is bad
	Msg   string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
			if e.Col > 0 {
				fmt.Fprintf(&b, ":%d", e.Col)
			}
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(Clip(e.Msg, maxMessageBytes))
	return b.String()
}

// Load reads, defaults and validates the job file at path. On any problem it
// returns a nil Spec and an error listing every problem (errors.Join of
// *FieldError), each naming the file, line and field.
func Load(path string) (*Spec, error) {
	src, err := readCapped(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, src)
}

// Parse is Load for a job file already in memory; path names it in errors
// and anchors its relative paths.
func Parse(path string, src []byte) (*Spec, error) {
	s, err := ParsePartial(path, src)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// LoadPartial is Load that goes as far as the file allows, for validate:
// with unknown keys or invalid settings it still returns the Spec it could
// decode (defaults applied), so the sources and the output folder can be
// checked in the same pass. The error lists every problem in the job file;
// the Spec is nil only when the file cannot be decoded at all (syntax, a
// value of the wrong type, too big). A Spec returned with an error must not
// be run.
func LoadPartial(path string) (*Spec, error) {
	src, err := readCapped(path)
	if err != nil {
		return nil, err
	}
	return ParsePartial(path, src)
}

// ParsePartial is LoadPartial for a job file already in memory.
func ParsePartial(path string, src []byte) (*Spec, error) {
	if err := checkSize(path, len(src)); err != nil {
		return nil, err
	}
	// A file that does not parse has no tree: the decoder reports the
	// syntax error with its position.
	var body ast.Node
	if f, err := parser.ParseBytes(src, 0); err == nil && len(f.Docs) > 0 && f.Docs[0] != nil {
		body = f.Docs[0].Body
	}
	// Aliases are counted before anything expands them.
	if err := checkAliases(path, body); err != nil {
		return nil, err
	}
	loc := newLocator(body)
	errs := checkShape(path, body)
	// Unknown keys are reported already: decode the rest leniently to go on
	// to the settings' checks. A value of the wrong type stops here.
	var s Spec
	opts := []yaml.DecodeOption{yaml.DisallowUnknownField()}
	if len(errs) > 0 {
		opts = nil
	}
	if err := yaml.UnmarshalWithOptions(src, &s, opts...); err != nil {
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return nil, decodeError(path, loc, src, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("job file path %s: %w", path, err)
	}
	s.Path = path
	s.Dir = filepath.Dir(abs)
	s.loc = loc
	s.applyDefaults()
	if err := s.Validate(); err != nil {
		errs = append(errs, withoutRepeats(Problems(err), errs)...)
	}
	if len(errs) > 0 {
		return &s, errors.Join(errs...)
	}
	return &s, nil
}

// Problems lists the problems an error of Load, LoadPartial or Validate
// joins (itself when it joins none).
func Problems(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// withoutRepeats drops the settings' problems at a field the shape check
// already reported, or above or below it: a wrong or unknown key there
// would be reported twice in other words.
func withoutRepeats(problems, shape []error) []error {
	related := func(a, b string) bool {
		under := func(x, y string) bool {
			return strings.HasPrefix(x, y) && (len(x) == len(y) || x[len(y)] == '.' || x[len(y)] == '[')
		}
		return under(a, b) || under(b, a)
	}
	var out []error
	for _, p := range problems {
		var fe, se *FieldError
		repeat := false
		for _, s := range shape {
			if errors.As(p, &fe) && errors.As(s, &se) && fe.Field != "" && se.Field != "" && related(fe.Field, se.Field) {
				repeat = true
				break
			}
		}
		if !repeat {
			out = append(out, p)
		}
	}
	return out
}

var quotedRE = regexp.MustCompile(`"([^"]*)"`)

// decodeError turns a strict-mode decode error into a FieldError with the
// file, line, column and, when the position maps to one, the field path.
func decodeError(file string, loc *locator, src []byte, err error) error {
	var ye yaml.Error
	if errors.As(err, &ye) {
		fe := &FieldError{File: file, Msg: ye.GetMessage()}
		if p, ok := tokPos(ye.GetToken()); ok {
			fe.Line, fe.Col = p.line, p.col
			fe.Field = loc.pathAt(p)
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			fe.Msg = fmt.Sprintf("want %s, got %s", typeName(te.DstType), typeName(te.SrcType))
		}
		return fe
	}
	// A bad duration comes back from time.ParseDuration without a position:
	// find the offending value in the file by its text.
	// time's message ends with the whole value quoted.
	if ms := quotedRE.FindAllStringSubmatch(err.Error(), -1); len(ms) > 0 && strings.HasPrefix(err.Error(), "time: ") {
		val := ms[len(ms)-1][1]
		fe := &FieldError{File: file, Msg: fmt.Sprintf("invalid duration %q (want e.g. 30s, 5m, 2h)", val)}
		if p, path, ok := loc.findValue(val); ok {
			fe.Line, fe.Col, fe.Field = p.line, p.col, path
		}
		return fe
	}
	return &FieldError{File: file, Msg: err.Error()}
}

var durationType = reflect.TypeOf(time.Duration(0))

// typeName names a Go type the way a job file author thinks of it.
func typeName(t reflect.Type) string {
	if t == nil {
		return "null"
	}
	if t == durationType {
		return "duration (e.g. 30s)"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "list"
	case reflect.Map, reflect.Struct:
		return "mapping"
	case reflect.Pointer:
		return typeName(t.Elem())
	}
	return t.String()
}
