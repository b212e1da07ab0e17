package rawjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	"github.com/go-json-experiment/json/jsontext"
)

// Member is one member of an object.
type Member struct {
	Key   string // decoded
	Value []byte // the value's bytes in the text, without surrounding whitespace
	// Spaced: the value holds whitespace outside its strings, so it is not
	// in the compact form encoding/json writes for a raw value.
	Spaced bool
}

// Text decodes the member's value, a string, as String does, without
// checking it again.
func (m Member) Text() (string, error) {
	if len(m.Value) < 2 || m.Value[0] != '"' || m.Value[len(m.Value)-1] != '"' {
		return "", errNotString
	}
	// The walk checked the string: the only errors left are invalid UTF-8
	// and lone surrogates, which become U+FFFD as encoding/json has them.
	out, _ := jsontext.AppendUnquote(make([]byte, 0, len(m.Value)), m.Value)
	if len(out) == 0 {
		return "", nil
	}
	return unsafe.String(&out[0], len(out)), nil // out is not kept: no second copy
}

// ErrStop, returned by a callback, ends the walk early without an error;
// the rest of the text is then not checked.
var ErrStop = errors.New("rawjson: stop")

var errNotString = errors.New("rawjson: not a string")

// v1Grammar is the grammar encoding/json.Valid applies: duplicate names
// and invalid UTF-8 inside strings are accepted.
var v1Grammar = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

var decoders = sync.Pool{New: func() any { return new(jsontext.Decoder) }}

// walk hands fn a decoder reading b (a bytes.Buffer: the decoder reads b
// in place, so the values it returns are slices of b).
func walk(b []byte, fn func(*jsontext.Decoder) error) error {
	d := decoders.Get().(*jsontext.Decoder)
	d.Reset(bytes.NewBuffer(b), v1Grammar...)
	err := fn(d)
	d.Reset(bytes.NewBuffer(nil))
	decoders.Put(d)
	return err
}

// Object calls fn for each member of the object b holds, in order. An
// error says b is not a JSON object (or fn's error, unless ErrStop).
func Object(b []byte, fn func(Member) error) error {
	return walk(b, func(d *jsontext.Decoder) error {
		return members(b, d, fn)
	})
}

func members(b []byte, d *jsontext.Decoder, fn func(Member) error) error {
	if err := open(d, '{', "want an object"); err != nil {
		return err
	}
	for d.PeekKind() == '"' {
		key, err := d.ReadToken()
		if err != nil {
			return fmt.Errorf("json offset %d: %w", d.InputOffset(), err)
		}
		name := key.String()
		v, spaced, err := readValue(b, d)
		if err != nil {
			return fmt.Errorf("json offset %d: %w", d.InputOffset(), err)
		}
		if err := fn(Member{Key: name, Value: v, Spaced: spaced}); err != nil {
			return stopped(err)
		}
	}
	return end(d, '}')
}

// Array calls fn for each element of the array b holds, in order, with
// the element's bytes. An error says b is not a JSON array (or fn's error,
// unless ErrStop).
func Array(b []byte, fn func(elem []byte) error) error {
	return walk(b, func(d *jsontext.Decoder) error {
		if err := open(d, '[', "want an array"); err != nil {
			return err
		}
		for k := d.PeekKind(); k != ']' && k != 0; k = d.PeekKind() {
			v, err := d.ReadValue()
			if err != nil {
				return fmt.Errorf("json offset %d: %w", d.InputOffset(), err)
			}
			if err := fn(v); err != nil {
				return stopped(err)
			}
		}
		return end(d, ']')
	})
}

func open(d *jsontext.Decoder, kind jsontext.Kind, want string) error {
	if d.PeekKind() != kind {
		return fmt.Errorf("json offset %d: %s", d.InputOffset(), want)
	}
	_, err := d.ReadToken()
	return err
}

// end reads the closing bracket and checks that only whitespace follows.
func end(d *jsontext.Decoder, closer jsontext.Kind) error {
	tok, err := d.ReadToken()
	if err == nil && tok.Kind() != closer {
		err = fmt.Errorf("want %v", closer)
	}
	if err == nil {
		if _, err = d.ReadToken(); err == io.EOF {
			return nil
		} else if err == nil {
			err = errors.New("text after the value")
		}
	}
	return fmt.Errorf("json offset %d: %w", d.InputOffset(), err)
}

func stopped(err error) error {
	if err == ErrStop {
		return nil
	}
	return err
}

// readValue reads the next value of b, an object or array token by token
// to see whitespace between its tokens (jsontext's Compact would find it
// too, but copies and rewrites the value).
func readValue(b []byte, d *jsontext.Decoder) (v []byte, spaced bool, err error) {
	k := d.PeekKind()
	if k != '{' && k != '[' {
		v, err = d.ReadValue()
		return v, false, err
	}
	// The unread bytes start where the last token ended, in b (the decoder
	// reads b in place): only whitespace, ':' or ',' come before the
	// bracket PeekKind saw.
	start := int(d.InputOffset()) + bytes.IndexByte(d.UnreadBuffer(), byte(k))
	depth := d.StackDepth()
	for {
		if _, err := d.ReadToken(); err != nil {
			return nil, false, err
		}
		if d.StackDepth() == depth {
			return b[start:d.InputOffset()], spaced, nil
		}
		spaced = spaced || spaceFollows(d.UnreadBuffer())
	}
}

// spaceFollows reports whitespace after a token, before or after the ','
// or ':' that may come next.
func spaceFollows(rest []byte) bool {
	if len(rest) > 1 && (rest[0] == ',' || rest[0] == ':') {
		rest = rest[1:]
	}
	return len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t' || rest[0] == '\r' || rest[0] == '\n')
}

// String decodes the JSON string v (a value Object or Array gave) as
// encoding/json does, invalid UTF-8 and lone surrogates becoming U+FFFD.
func String(v []byte) (string, error) {
	var s string
	err := walk(v, func(d *jsontext.Decoder) error {
		if d.PeekKind() != '"' {
			return errNotString
		}
		tok, err := d.ReadToken()
		if err != nil {
			return err
		}
		s = tok.String()
		if _, err := d.ReadToken(); err != io.EOF {
			return errNotString
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%w: %w", errNotString, err)
	}
	return s, nil
}
