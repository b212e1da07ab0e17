package job

import (
	"fmt"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// pos is a place in the job file.
type pos struct{ line, col int }

// locator maps field paths (name, lanes[1].max_tokens) to where they are
// written in the job file, and positions back to paths, so that semantic
// errors found after decoding can still point at a line.
type locator struct {
	byPath map[string]pos
	// byPos maps "line:col" of every key and value token to its field path.
	byPos map[pos]string
	// values maps the text of string scalars to their first occurrence.
	values map[string]valueAt
}

type valueAt struct {
	at   pos
	path string
}

// newLocator indexes the job file's syntax tree; a file that did not parse
// (nil body) yields an empty locator.
func newLocator(body ast.Node) *locator {
	l := &locator{byPath: map[string]pos{}, byPos: map[pos]string{}, values: map[string]valueAt{}}
	l.walk("", body)
	return l
}

func tokPos(t *token.Token) (pos, bool) {
	if t == nil || t.Position == nil {
		return pos{}, false
	}
	return pos{t.Position.Line, t.Position.Column}, true
}

func (l *locator) walk(path string, n ast.Node) {
	if n == nil {
		return
	}
	if p, ok := tokPos(n.GetToken()); ok {
		if _, seen := l.byPos[p]; !seen {
			l.byPos[p] = path
		}
	}
	switch n := n.(type) {
	case *ast.DocumentNode:
		l.walk(path, n.Body)
	case *ast.TagNode:
		l.walk(path, n.Value)
	case *ast.AnchorNode:
		l.walk(path, n.Value)
	case *ast.MappingNode:
		for _, mv := range n.Values {
			l.walkPair(path, mv)
		}
	case *ast.MappingValueNode:
		l.walkPair(path, n)
	case *ast.StringNode:
		if p, ok := tokPos(n.GetToken()); ok {
			if _, seen := l.values[n.Value]; !seen {
				l.values[n.Value] = valueAt{p, path}
			}
		}
	case *ast.SequenceNode:
		for i, v := range n.Values {
			child := fmt.Sprintf("%s[%d]", path, i)
			if p, ok := tokPos(v.GetToken()); ok {
				l.byPath[child] = p
				l.byPos[p] = child
			}
			l.walk(child, v)
		}
	}
}

func (l *locator) walkPair(path string, mv *ast.MappingValueNode) {
	key := keyString(mv.Key)
	child := key
	if path != "" {
		child = path + "." + key
	}
	if p, ok := tokPos(mv.Key.GetToken()); ok {
		l.byPath[child] = p
		l.byPos[p] = child
	}
	l.walk(child, mv.Value)
}

func keyString(k ast.MapKeyNode) string {
	switch k := k.(type) {
	case *ast.StringNode:
		return k.Value
	case nil:
		return ""
	}
	return strings.TrimSpace(k.String())
}

// has reports whether the field at path is written in the file.
func (l *locator) has(path string) bool {
	if l == nil {
		return false
	}
	_, ok := l.byPath[path]
	return ok
}

// line returns the line of path, or of its nearest written parent when the
// field itself is missing (a required field points at its enclosing block).
// It returns 0 when nothing is known (a Spec built in code).
func (l *locator) line(path string) int {
	if l == nil {
		return 0
	}
	for p := path; p != ""; p = parentPath(p) {
		if at, ok := l.byPath[p]; ok {
			return at.line
		}
	}
	if len(l.byPath) == 0 {
		return 0
	}
	return 1
}

// pathAt returns the field path of the token at p, "" when unknown.
func (l *locator) pathAt(p pos) string {
	if l == nil {
		return ""
	}
	return l.byPos[p]
}

// parentPath drops the last component: lanes[1].max_tokens -> lanes[1] -> lanes.
func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

// findValue returns where the string scalar v is first written.
func (l *locator) findValue(v string) (pos, string, bool) {
	if l == nil {
		return pos{}, "", false
	}
	va, ok := l.values[v]
	return va.at, va.path, ok
}
