package job

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
)

// checkShape walks the job file's syntax tree against Spec and returns
// every unknown key (with the nearest known one as a suggestion) and every
// value of the wrong kind, each at its line and column, so one run of
// validate shows all of them. The decoder stops at the first.
//
// Numbers are numbers: `concurrency: "4"` is refused like
// `concurrency: "four"`. A string field takes any scalar as its text.
func checkShape(file string, body ast.Node) []error {
	if body == nil {
		return nil // the decoder reports syntax errors with their position
	}
	c := &shapeChecker{file: file}
	c.value("", body, reflect.TypeOf(Spec{}))
	return c.errs
}

type shapeChecker struct {
	file string
	errs []error
}

func (c *shapeChecker) addf(n ast.Node, path, format string, args ...any) {
	fe := &FieldError{File: c.file, Field: path, Msg: fmt.Sprintf(format, args...)}
	if p, ok := tokPos(n.GetToken()); ok {
		fe.Line, fe.Col = p.line, p.col
	}
	c.errs = append(c.errs, fe)
}

// value checks node n at path against Go type t.
func (c *shapeChecker) value(path string, n ast.Node, t reflect.Type) {
	switch v := n.(type) {
	case *ast.TagNode:
		c.value(path, v.Value, t)
		return
	case *ast.AnchorNode:
		c.value(path, v.Value, t)
		return
	case *ast.AliasNode, *ast.NullNode, nil:
		return // aliases are checked where they are defined; null leaves the default
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == concurrencyType {
		c.concurrency(path, n)
		return
	}
	if t == durationType {
		c.duration(path, n)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		c.structFields(path, n, t)
	case reflect.Map:
		m, ok := mapping(n)
		if !ok {
			c.addf(n, path, "want mapping, got %s", nodeKind(n))
			return
		}
		for _, mv := range m {
			c.value(joinPath(path, keyString(mv.Key)), mv.Value, t.Elem())
		}
	case reflect.Slice:
		seq, ok := n.(*ast.SequenceNode)
		if !ok {
			c.addf(n, path, "want list, got %s", nodeKind(n))
			return
		}
		for i, item := range seq.Values {
			c.value(fmt.Sprintf("%s[%d]", path, i), item, t.Elem())
		}
	default:
		c.scalar(path, n, t)
	}
}

func (c *shapeChecker) duration(path string, n ast.Node) {
	s, ok := n.(*ast.StringNode)
	if !ok {
		c.addf(n, path, "want duration (e.g. 30s), got %s", nodeKind(n))
	} else if _, err := time.ParseDuration(s.Value); err != nil {
		c.addf(n, path, "invalid duration %q (want e.g. 30s, 5m, 2h)", s.Value)
	}
}

// structFields checks mapping n against struct t's yaml fields: unknown
// keys (with a suggestion) and each known field's value.
func (c *shapeChecker) structFields(path string, n ast.Node, t reflect.Type) {
	m, ok := mapping(n)
	if !ok {
		c.addf(n, path, "want mapping, got %s", nodeKind(n))
		return
	}
	fields := yamlFields(t)
	for _, mv := range m {
		key := keyString(mv.Key)
		if _, merge := mv.Key.(*ast.MergeKeyNode); merge {
			continue
		}
		child := joinPath(path, key)
		ft, known := fields[key]
		if !known {
			msg := fmt.Sprintf("unknown field %q", key)
			if s := suggest(key, fields); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			c.addf(mv.Key, child, "%s", msg)
			continue
		}
		c.value(child, mv.Value, ft)
	}
}

// scalar checks n against a number, boolean or string type t.
func (c *shapeChecker) scalar(path string, n ast.Node, t reflect.Type) {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if _, ok := n.(*ast.IntegerNode); !ok {
			c.addf(n, path, "want integer, got %s%s", nodeKind(n), unquoteHint(n))
		}
	case reflect.Float32, reflect.Float64:
		switch n.(type) {
		case *ast.IntegerNode, *ast.FloatNode:
		default:
			c.addf(n, path, "want number, got %s%s", nodeKind(n), unquoteHint(n))
		}
	case reflect.Bool:
		if _, ok := n.(*ast.BoolNode); !ok {
			c.addf(n, path, "want boolean (true or false), got %s", nodeKind(n))
		}
	case reflect.String:
		if _, ok := n.(ast.ScalarNode); !ok {
			c.addf(n, path, "want string, got %s", nodeKind(n))
		}
	}
}

// mapping returns the key-value pairs of a mapping node ({} included).
func mapping(n ast.Node) ([]*ast.MappingValueNode, bool) {
	switch v := n.(type) {
	case *ast.MappingNode:
		return v.Values, true
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{v}, true
	}
	return nil, false
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps the YAML keys of struct type t to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// nodeKind names a YAML value the way a job file author thinks of it.
func nodeKind(n ast.Node) string {
	switch v := n.(type) {
	case *ast.StringNode, *ast.LiteralNode:
		return fmt.Sprintf("string %q", strings.TrimSpace(fmt.Sprint(scalarValue(v))))
	case *ast.IntegerNode:
		return "integer " + v.GetToken().Value
	case *ast.FloatNode:
		return "number " + v.GetToken().Value
	case *ast.BoolNode:
		return "boolean " + v.GetToken().Value
	case *ast.SequenceNode:
		return "list"
	case *ast.MappingNode, *ast.MappingValueNode:
		return "mapping"
	}
	return "a " + strings.ToLower(n.Type().String())
}

func scalarValue(n ast.Node) any {
	if s, ok := n.(ast.ScalarNode); ok {
		return s.GetValue()
	}
	return n.String()
}

// unquoteHint tells the author of `concurrency: "4"` what to write.
func unquoteHint(n ast.Node) string {
	s, ok := n.(*ast.StringNode)
	if !ok {
		return ""
	}
	if _, err := fmt.Sscanf(s.Value, "%g", new(float64)); err == nil && strings.TrimSpace(s.Value) == s.Value && s.Value != "" {
		return fmt.Sprintf(" (write %s without quotes)", s.Value)
	}
	return ""
}

// suggest returns the known key nearest to key by edit distance, "" when
// none is near enough to be a typo.
func suggest(key string, known map[string]reflect.Type) string {
	best, bestD := "", len(key)/2+1
	for k := range known {
		if d := editDistance(key, k); d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	if bestD > max(2, len(key)/3) {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var concurrencyType = reflect.TypeOf(ConcurrencyValue{})

// concurrency checks a lane's concurrency: a whole number, auto, or a
// mapping of auto (boolean) and min, max, initial (whole numbers).
func (c *shapeChecker) concurrency(path string, n ast.Node) {
	switch v := n.(type) {
	case *ast.IntegerNode:
		return
	case *ast.StringNode:
		if strings.EqualFold(strings.TrimSpace(v.Value), "auto") {
			return
		}
		c.addf(n, path, "want integer or auto, got %s%s", nodeKind(n), unquoteHint(n))
		return
	}
	m, ok := mapping(n)
	if !ok {
		c.addf(n, path, "want integer, auto or a mapping {auto, min, max, initial}, got %s", nodeKind(n))
		return
	}
	keys := map[string]reflect.Type{"auto": reflect.TypeOf(true), "min": reflect.TypeOf(0), "max": reflect.TypeOf(0), "initial": reflect.TypeOf(0)}
	for _, mv := range m {
		key := keyString(mv.Key)
		child := joinPath(path, key)
		t, known := keys[key]
		if !known {
			msg := fmt.Sprintf("unknown field %q (want auto, min, max, initial)", key)
			if s := suggest(key, keys); s != "" {
				msg = fmt.Sprintf("unknown field %q (did you mean %q?)", key, s)
			}
			c.addf(mv.Key, child, "%s", msg)
			continue
		}
		c.value(child, mv.Value, t)
	}
}
