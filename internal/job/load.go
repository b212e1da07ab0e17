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
	b.WriteString(e.Msg)
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
	if errs := checkShape(path, body); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var s Spec
	if err := yaml.UnmarshalWithOptions(src, &s, yaml.DisallowUnknownField()); err != nil {
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
		return nil, err
	}
	return &s, nil
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
