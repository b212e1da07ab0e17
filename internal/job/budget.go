package job

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/goccy/go-yaml/ast"
)

// MaxFileBytes caps a job file. A job file holds settings, not data: its
// values go into every request, so a huge one (100 MB was once accepted:
// 4 GB of memory) is a mistake; prompts belong in a source file.
const MaxFileBytes = 4 << 20

// MaxAliasedValues caps the values YAML aliases add to a job file once
// expanded. The decoder shares an alias's value, but the request body
// repeats it: nine levels of nine-fold aliases (546 bytes) grew to 17.6 GB
// when the settings were encoded. Any job written by hand stays far below.
const MaxAliasedValues = 100_000

// MaxAliasedBytes caps the text YAML aliases add to a job file once
// expanded: a 1 MiB string repeated by 3,000 aliases is 3,000 values but
// 3 GB in every request body (and 23 GB of memory when validate printed it).
const MaxAliasedBytes = MaxFileBytes

// readCapped reads the job file at path, refusing one over MaxFileBytes
// without reading the rest of it.
func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read job file: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read job file %s: %w", path, err)
	}
	if err := checkSize(path, len(src)); err != nil {
		return nil, err
	}
	return src, nil
}

func checkSize(path string, n int) error {
	if n <= MaxFileBytes {
		return nil
	}
	return &FieldError{File: path, Msg: fmt.Sprintf("job file larger than %d MiB: a job file holds settings, sent with every request; put prompts and data in a source file",
		MaxFileBytes>>20)}
}

// LoadContext is Load that gives up when ctx ends (an interrupt), so a
// signal is obeyed at once even while a file is being read and parsed: the
// parse itself cannot be stopped, and is left to end with the process.
func LoadContext(ctx context.Context, path string) (*Spec, error) {
	return loadContext(ctx, path, Load)
}

// LoadPartialContext is LoadPartial that gives up when ctx ends.
func LoadPartialContext(ctx context.Context, path string) (*Spec, error) {
	return loadContext(ctx, path, LoadPartial)
}

func loadContext(ctx context.Context, path string, load func(string) (*Spec, error)) (*Spec, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	type loaded struct {
		s   *Spec
		err error
	}
	done := make(chan loaded, 1) // buffered: an abandoned load still ends
	go func() {
		s, err := load(path)
		done <- loaded{s, err}
	}()
	select {
	case l := <-done:
		return l.s, l.err
	case <-ctx.Done():
		return nil, fmt.Errorf("load %s: %w", path, ctx.Err())
	}
}

// aliasBudget walks a parsed job file and refuses it when its aliases,
// expanded, add more than MaxAliasedValues values or MaxAliasedBytes bytes.
// Sizes are counted, never expanded: each anchor's expanded size is
// remembered, and an alias adds its anchor's size, so the walk costs one
// pass over the written file.
type aliasBudget struct {
	file    string
	anchors map[string]expanded // expanded size of each anchor's value
	added   expanded            // what the aliases added so far
	err     error
}

// expanded is the size a node stands for once its aliases are expanded.
type expanded struct {
	values int // a mapping or a list counts itself and its items
	bytes  int // the text of its scalars, keys included
}

func (e expanded) plus(o expanded) expanded {
	return expanded{e.values + o.values, e.bytes + o.bytes}
}

func checkAliases(file string, body ast.Node) error {
	b := &aliasBudget{file: file, anchors: map[string]expanded{}}
	b.size("", body)
	return b.err
}

// size returns what n stands for once aliases are expanded.
func (b *aliasBudget) size(path string, n ast.Node) expanded {
	if n == nil || b.err != nil {
		return expanded{}
	}
	switch v := n.(type) {
	case *ast.DocumentNode:
		return b.size(path, v.Body)
	case *ast.TagNode:
		return b.size(path, v.Value)
	case *ast.AnchorNode:
		name := v.Name.GetToken().Value
		b.anchors[name] = expanded{values: 1} // an alias inside its own anchor stands for one value
		s := b.size(path, v.Value)
		b.anchors[name] = s
		return s
	case *ast.AliasNode:
		return b.alias(path, v)
	case *ast.MappingNode:
		total := expanded{values: 1}
		for _, mv := range v.Values {
			total = total.plus(b.size(path, mv))
		}
		return total
	case *ast.MappingValueNode:
		return b.size(path, v.Key).plus(b.size(joinPath(path, keyString(v.Key)), v.Value))
	case *ast.MappingKeyNode:
		return b.size(path, v.Value)
	case *ast.SequenceNode:
		total := expanded{values: 1}
		for i, item := range v.Values {
			total = total.plus(b.size(fmt.Sprintf("%s[%d]", path, i), item))
		}
		return total
	}
	return expanded{values: 1, bytes: scalarBytes(n)}
}

func (b *aliasBudget) alias(path string, v *ast.AliasNode) expanded {
	name := v.Value.GetToken().Value
	s := b.anchors[name]
	s.values = max(s.values, 1)
	b.added = b.added.plus(s)
	if b.err != nil {
		return s
	}
	switch {
	case b.added.values > MaxAliasedValues:
		b.err = b.refuse(v, path, fmt.Sprintf("alias *%s repeats %d values, which takes the file's aliases past %d values once expanded (an alias bomb?); write the values out or use fewer aliases",
			name, s.values, MaxAliasedValues))
	case b.added.bytes > MaxAliasedBytes:
		b.err = b.refuse(v, path, fmt.Sprintf("alias *%s repeats %d bytes, which takes the file's aliases past %d bytes (%d MiB) once expanded (an alias bomb?); write the values out or use fewer aliases",
			name, s.bytes, MaxAliasedBytes, MaxAliasedBytes>>20))
	}
	return s
}

// scalarBytes is the length of a scalar's text (a block literal's too).
func scalarBytes(n ast.Node) int {
	switch v := n.(type) {
	case *ast.StringNode:
		return len(v.Value)
	case *ast.LiteralNode:
		if v.Value != nil {
			return len(v.Value.Value)
		}
	}
	if tok := n.GetToken(); tok != nil {
		return len(tok.Value)
	}
	return 0
}

func (b *aliasBudget) refuse(n ast.Node, path, msg string) error {
	fe := &FieldError{File: b.file, Field: path, Msg: msg}
	if p, ok := tokPos(n.GetToken()); ok {
		fe.Line, fe.Col = p.line, p.col
	}
	return fe
}
