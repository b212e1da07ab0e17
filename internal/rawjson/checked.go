package rawjson

import (
	"bytes"
	"errors"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// The checked walks split a value a walk already checked without checking
// it again: a conversation's first turn walks its body once (Object) and
// then its messages and each message (CheckedArray, CheckedObject), and
// checking those again was two of the three passes over the history
// (BenchmarkTurnCost, 16k tokens). Strings are skipped with bytes.IndexByte
// to their closing quote. On text that was not checked they return an
// error or wrong bounds, never a panic (TestCheckedWalks).

var errUnchecked = errors.New("rawjson: not a checked value")

// CheckedObject is Object for a value a walk handed out, already checked:
// it is split, not checked again.
func CheckedObject(b []byte, fn func(Member) error) error {
	i, empty, err := openChecked(b, '{', '}')
	if err != nil || empty {
		return err
	}
	for more := true; more; {
		if i >= len(b) || b[i] != '"' {
			return errUnchecked
		}
		kend := skipString(b, i)
		key, err := checkedKey(b[i:kend])
		if err != nil {
			return err
		}
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return errUnchecked
		}
		i = skipSpace(b, i+1)
		vend, spaced := skipValue(b, i)
		if vend <= i {
			return errUnchecked
		}
		if err := fn(Member{Key: key, Value: b[i:vend], Spaced: spaced}); err != nil {
			return stopped(err)
		}
		if i, more, err = nextChecked(b, vend, '}'); err != nil {
			return err
		}
	}
	return nil
}

// CheckedArray is Array for a value a walk handed out, already checked
// (see CheckedObject).
func CheckedArray(b []byte, fn func(elem []byte) error) error {
	i, empty, err := openChecked(b, '[', ']')
	if err != nil || empty {
		return err
	}
	for more := true; more; {
		if i >= len(b) {
			return errUnchecked
		}
		end, _ := skipValue(b, i)
		if end <= i {
			return errUnchecked
		}
		if err := fn(b[i:end]); err != nil {
			return stopped(err)
		}
		if i, more, err = nextChecked(b, end, ']'); err != nil {
			return err
		}
	}
	return nil
}

// openChecked reads a container's opening bracket: where its first member
// or element starts, or empty when it closes at once (with onlySpaceAfter's
// verdict).
func openChecked(b []byte, open, close byte) (i int, empty bool, err error) {
	i = skipSpace(b, 0)
	if i >= len(b) || b[i] != open {
		return 0, false, errUnchecked
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == close {
		return 0, true, onlySpaceAfter(b, i+1)
	}
	return i, false, nil
}

// nextChecked reads what follows a member or element ending at end: the
// next one's start (more), or the container's close (with onlySpaceAfter's
// verdict).
func nextChecked(b []byte, end int, close byte) (next int, more bool, err error) {
	i := skipSpace(b, end)
	if i < len(b) && b[i] == ',' {
		return skipSpace(b, i+1), true, nil
	}
	if i < len(b) && b[i] == close {
		return 0, false, onlySpaceAfter(b, i+1)
	}
	return 0, false, errUnchecked
}

// checkedKey decodes a member's quoted name as the checking walk does.
func checkedKey(q []byte) (string, error) {
	if len(q) < 2 || q[len(q)-1] != '"' {
		return "", errUnchecked
	}
	inner := q[1 : len(q)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	out, _ := jsontext.AppendUnquote(nil, q) // invalid UTF-8 becomes U+FFFD
	return string(out), nil
}

// onlySpaceAfter is the end of a value closed at b[i-1], as Object and
// Array have it: only whitespace may follow. A value a walk handed out ends
// there; a whole stored body with more after it (a second object, any
// garbage) is refused, not split and sent with it.
func onlySpaceAfter(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errUnchecked
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipString returns the end of the string starting at b[i] ('"'): the
// index after its closing quote, len(b) when it has none.
func skipString(b []byte, i int) int {
	start := i + 1
	for i = start; ; i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		i += j
		k := i
		for k > start && b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 { // not escaped
			return i + 1
		}
	}
}

// skipValue returns the end of the value starting at b[i] and whether it
// holds whitespace outside its strings (Member.Spaced).
func skipValue(b []byte, i int) (end int, spaced bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i), false
	case '{', '[':
	default: // a number or a literal
		for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != ']' && b[i] != '}' && b[i] != ':' {
			i++
		}
		return i, false
	}
	depth := 0
	for i < len(b) {
		switch c := b[i]; {
		case c == '"':
			i = skipString(b, i)
			continue
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1, spaced
			}
		case isSpace(c):
			spaced = true
		}
		i++
	}
	return len(b), spaced
}
