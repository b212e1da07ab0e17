package rawjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

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
	return checkedString(m.Value)
}

// ErrStop, returned by a callback, ends the walk early without an error;
// the rest of the text is then not checked.
var ErrStop = errors.New("rawjson: stop")

// Object calls fn for each member of the object b holds, in order. An
// error says b is not a JSON object (or fn's error, unless ErrStop).
func Object(b []byte, fn func(Member) error) error {
	return object(scanner{b: b}, fn)
}

// CheckedObject is Object for a value a walk handed out, already checked:
// it is walked without checking it again (strings are skipped to their
// closing quote). On text that was not checked the members may be wrong,
// but it never panics.
func CheckedObject(b []byte, fn func(Member) error) error {
	return object(scanner{b: b, checked: true}, fn)
}

// CheckedArray is Array for a value a walk handed out, already checked
// (see CheckedObject).
func CheckedArray(b []byte, fn func(elem []byte) error) error {
	return array(scanner{b: b, checked: true}, fn)
}

func object(s scanner, fn func(Member) error) error {
	b := s.b
	s.space()
	if !s.eat('{') {
		return s.fail("want an object")
	}
	s.space()
	if s.eat('}') {
		return s.end()
	}
	for {
		s.space()
		k0 := s.i
		esc, err := s.str()
		if err != nil {
			return err
		}
		key := string(b[k0+1 : s.i-1])
		if esc {
			if err := json.Unmarshal(b[k0:s.i], &key); err != nil {
				return s.fail("bad key")
			}
		}
		s.space()
		if !s.eat(':') {
			return s.fail("want ':'")
		}
		s.space()
		v0, spaced := s.i, false
		if spaced, err = s.value(0); err != nil {
			return err
		}
		if err := fn(Member{Key: key, Value: b[v0:s.i], Spaced: spaced}); err != nil {
			if err == ErrStop {
				return nil
			}
			return err
		}
		s.space()
		if s.eat('}') {
			return s.end()
		}
		if !s.eat(',') {
			return s.fail("want ',' or '}'")
		}
	}
}

// Array calls fn for each element of the array b holds, in order, with
// the element's bytes. An error says b is not a JSON array (or fn's error,
// unless ErrStop).
func Array(b []byte, fn func(elem []byte) error) error {
	return array(scanner{b: b}, fn)
}

func array(s scanner, fn func(elem []byte) error) error {
	b := s.b
	s.space()
	if !s.eat('[') {
		return s.fail("want an array")
	}
	s.space()
	if s.eat(']') {
		return s.end()
	}
	for {
		s.space()
		v0 := s.i
		if _, err := s.value(0); err != nil {
			return err
		}
		if err := fn(b[v0:s.i]); err != nil {
			if err == ErrStop {
				return nil
			}
			return err
		}
		s.space()
		if s.eat(']') {
			return s.end()
		}
		if !s.eat(',') {
			return s.fail("want ',' or ']'")
		}
	}
}

type scanner struct {
	b []byte
	i int
	// checked: the text was checked before; strings are only skipped.
	checked bool
}

func (s *scanner) fail(what string) error {
	return fmt.Errorf("json offset %d: %s", s.i, what)
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// space skips whitespace and reports whether there was any.
func (s *scanner) space() bool {
	i0 := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return s.i > i0
		}
	}
	return s.i > i0
}

// end checks that only whitespace follows.
func (s *scanner) end() error {
	s.space()
	if s.i != len(s.b) {
		return s.fail("text after the value")
	}
	return nil
}

// value skips one value; spaced reports whitespace inside it outside strings.
func (s *scanner) value(depth int) (spaced bool, err error) {
	if s.i >= len(s.b) {
		return false, s.fail("unexpected end")
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, err = s.str()
		return false, err
	case c == '{' || c == '[':
		return s.nested(depth + 1)
	case c == 't':
		return false, s.word("true")
	case c == 'f':
		return false, s.word("false")
	case c == 'n':
		return false, s.word("null")
	case c == '-' || c >= '0' && c <= '9':
		return false, s.number()
	}
	return false, s.fail("unexpected character")
}

// nested skips an object or an array.
func (s *scanner) nested(depth int) (spaced bool, err error) {
	if depth > maxDepth {
		return false, s.fail("nested too deep")
	}
	obj := s.b[s.i] == '{'
	closer := byte(']')
	if obj {
		closer = '}'
	}
	s.i++
	spaced = s.space()
	if s.eat(closer) {
		return spaced, nil
	}
	for {
		spaced = s.space() || spaced
		if obj {
			if _, err := s.str(); err != nil {
				return false, err
			}
			spaced = s.space() || spaced
			if !s.eat(':') {
				return false, s.fail("want ':'")
			}
			spaced = s.space() || spaced
		}
		sp, err := s.value(depth)
		if err != nil {
			return false, err
		}
		spaced = s.space() || sp || spaced
		if s.eat(closer) {
			return spaced, nil
		}
		if !s.eat(',') {
			return false, s.fail("want ',' or a closing bracket")
		}
	}
}

// plain marks the bytes a string holds as they are (not '"', '\\' or a
// control character).
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str skips a string; esc reports an escape in it.
func (s *scanner) str() (esc bool, err error) {
	if !s.eat('"') {
		return false, s.fail("want a string")
	}
	if s.checked {
		return s.skipStr()
	}
	b := s.b
	for i := s.i; i < len(b); {
		for i+8 <= len(b) && !special(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		if plain[c] {
			i++
			continue
		}
		switch c {
		case '"':
			s.i = i + 1
			return esc, nil
		case '\\':
			esc = true
			if i+1 >= len(b) {
				s.i = i
				return false, s.fail("unterminated escape")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !hex4(b[i+2:i+6]) {
					s.i = i
					return false, s.fail("bad \\u escape")
				}
				i += 6
			default:
				s.i = i
				return false, s.fail("bad escape")
			}
		default:
			s.i = i
			return false, s.fail("control character in a string")
		}
	}
	s.i = len(b)
	return false, s.fail("unterminated string")
}

// special reports whether any of the 8 bytes in x is '"', '\\' or a
// control character (SWAR: a byte below 0x20, or one equal to either,
// sets its top bit in the result; no byte is missed, and a false alarm
// only sends the word through the byte loop).
func special(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	below := (x - ones*0x20) & ^x & highs
	return below|zero(x^(ones*'"'))|zero(x^(ones*'\\')) != 0
}

// skipStr finds the closing quote of a checked string: the first quote
// not escaped by an odd run of backslashes.
func (s *scanner) skipStr() (esc bool, err error) {
	b, start := s.b, s.i
	for i := start; ; {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			s.i = len(b)
			return false, s.fail("unterminated string")
		}
		i += j
		k := i
		for k > start && b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 {
			s.i = i + 1
			return bytes.IndexByte(b[start:i], '\\') >= 0, nil
		}
		i++
	}
}

func hex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func (s *scanner) word(w string) error {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return s.fail("bad literal")
	}
	s.i += len(w)
	return nil
}

// number skips a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	s.eat('-')
	switch {
	case s.eat('0'):
	case s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9':
		s.digits()
	default:
		return s.fail("bad number")
	}
	if s.eat('.') && !s.digits() {
		return s.fail("bad number")
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if !s.digits() {
			return s.fail("bad number")
		}
	}
	return nil
}

// digits skips [0-9]* and reports whether there was one.
func (s *scanner) digits() bool {
	i0 := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > i0
}

// String decodes the JSON string v (a value Object or Array gave) as
// encoding/json does, invalid UTF-8 and lone surrogates becoming U+FFFD.
// A string without escapes costs one copy.
func String(v []byte) (string, error) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", errors.New("rawjson: not a string")
	}
	return decodeString(scanner{b: v})
}

// checkedString is String for a value a walk handed out, already checked.
func checkedString(v []byte) (string, error) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", errors.New("rawjson: not a string")
	}
	return decodeString(scanner{b: v, checked: true})
}

func decodeString(s scanner) (string, error) {
	v := s.b
	esc, err := s.str()
	if err != nil || s.i != len(v) {
		return "", errors.New("rawjson: not a string")
	}
	in := v[1 : len(v)-1]
	if !esc && utf8.Valid(in) {
		return string(in), nil
	}
	return string(unquote(in)), nil
}

// unquote decodes the inside of a valid JSON string.
func unquote(in []byte) []byte {
	out := make([]byte, 0, len(in))
	for len(in) > 0 {
		run := bytes.IndexByte(in, '\\')
		if run < 0 {
			run = len(in)
		}
		out = appendUTF8(out, in[:run])
		in = in[run:]
		if len(in) == 0 {
			break
		}
		if len(in) < 2 {
			break // a text not checked: never panic
		}
		if in[1] != 'u' {
			out = append(out, unescape[in[1]])
			in = in[2:]
			continue
		}
		if len(in) < 6 {
			break
		}
		r := hexRune(in[2:6])
		in = in[6:]
		if utf16.IsSurrogate(r) {
			r1 := rune(-1)
			if len(in) >= 6 && in[0] == '\\' && in[1] == 'u' {
				r1 = hexRune(in[2:6])
			}
			if dec := utf16.DecodeRune(r, r1); dec != utf8.RuneError {
				out = utf8.AppendRune(out, dec)
				in = in[6:]
				continue
			}
			r = utf8.RuneError
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// unescape is the byte each one-letter escape stands for.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// appendUTF8 appends b, each byte of it that is not UTF-8 as U+FFFD.
func appendUTF8(out, b []byte) []byte {
	if utf8.Valid(b) {
		return append(out, b...)
	}
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:size]...)
		}
		b = b[size:]
	}
	return out
}

// hexRune reads four hex digits (already checked).
func hexRune(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// AppendString appends s as encoding/json writes a string with HTML
// escaping off: '"', '\\' and control characters escaped (\b, \f, \n, \r,
// \t by name), invalid UTF-8 as \ufffd, U+2028 and U+2029 as \u escapes,
// everything else as it is.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		for i+8 <= len(s) && !special(binary.LittleEndian.Uint64([]byte(s[i:i+8]))) && ascii(s[i:i+8]) {
			i += 8
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if plain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			switch r {
			case utf8.RuneError:
				dst = append(dst, `\ufffd`...)
			default:
				dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// ascii reports whether the 8 bytes of s are all below 0x80.
func ascii(s string) bool {
	return binary.LittleEndian.Uint64([]byte(s))&0x8080808080808080 == 0
}
