package rawjson

import (
	"bytes"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// AppendString appends s as encoding/json writes a string with HTML
// escaping off: jsontext's minimal quoting (RFC 8785), plus the two
// escapes encoding/json adds: U+2028 and U+2029 as \u escapes (jsontext's
// EscapeForJS, an Encoder option AppendQuote does not take), and each
// invalid UTF-8 byte as \ufffd (jsontext writes U+FFFD itself).
func AppendString(dst []byte, s string) []byte {
	if !utf8.ValidString(s) {
		return appendInvalid(dst, s)
	}
	n := len(dst)
	dst, _ = jsontext.AppendQuote(dst, s)
	return escapeJS(dst, n)
}

// appendInvalid quotes the valid runs of s and writes \ufffd between them.
func appendInvalid(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for len(s) > 0 {
		run := 0
		for run < len(s) {
			r, size := utf8.DecodeRuneInString(s[run:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			run += size
		}
		if run > 0 {
			n := len(dst)
			dst, _ = jsontext.AppendQuote(dst, s[:run])
			dst = append(dst[:n], dst[n+1:len(dst)-1]...) // without its quotes
			dst = escapeJS(dst, n)
		}
		if run < len(s) {
			dst = append(dst, `\ufffd`...)
			run++
		}
		s = s[run:]
	}
	return append(dst, '"')
}

// escapeJS rewrites U+2028 and U+2029 in dst[from:] as \u2028 and \u2029.
// Both start with the bytes E2 80, as do other punctuation (dashes,
// curly quotes), so each E2 80 is looked at.
func escapeJS(dst []byte, from int) []byte {
	var out []byte
	last := from
	for i := from; ; i += 2 {
		j := bytes.Index(dst[i:], []byte{0xe2, 0x80})
		if j < 0 || i+j+2 >= len(dst) {
			break
		}
		i += j
		if c := dst[i+2]; c == 0xa8 || c == 0xa9 {
			if out == nil {
				out = append(make([]byte, 0, len(dst)+8), dst[:from]...)
			}
			out = append(append(out, dst[last:i]...), '\\', 'u', '2', '0', '2', "89"[c-0xa8])
			last = i + 3
		}
	}
	if out == nil {
		return dst
	}
	return append(out, dst[last:]...)
}

// AppendQuoted appends quoted, a JSON string checked by a walk, as
// AppendString writes the text it holds, without decoding it, and reports
// whether it could: the string is copied as it is but for encoding/json's
// HTML escapes (\u003c, \u003e, \u0026), written as the characters; any
// other escape AppendString would not write (\/, \u0041, a raw U+2028,
// \ufffd for an invalid byte) gives false and dst unchanged. The walk
// refused raw control characters and quotes, so only escapes, invalid
// UTF-8 and U+2028/U+2029 are looked for, each with a fast scan.
func AppendQuoted(dst, quoted []byte) ([]byte, bool) {
	if len(quoted) < 2 || quoted[0] != '"' || quoted[len(quoted)-1] != '"' {
		return dst, false
	}
	s := quoted[1 : len(quoted)-1]
	if !utf8.Valid(s) || hasJSSeparator(s) {
		return dst, false
	}
	n := len(dst)
	dst = append(dst, '"')
	run := 0 // s[run:i] is copied as it is
	for i := 0; ; {
		j := bytes.IndexByte(s[i:], '\\')
		if j < 0 {
			break
		}
		i += j
		if e := canonicalEscape(s[i:]); e > 0 {
			i += e
			continue
		}
		html := htmlEscape(s[i:])
		if html == 0 {
			return dst[:n], false
		}
		dst = append(append(dst, s[run:i]...), html)
		i += 6
		run = i
	}
	return append(append(dst, s[run:]...), '"'), true
}

// hasJSSeparator reports whether s holds U+2028 or U+2029, which
// AppendString escapes.
func hasJSSeparator(s []byte) bool {
	for i := 0; ; i += 2 {
		j := bytes.Index(s[i:], []byte{0xe2, 0x80})
		if j < 0 || i+j+2 >= len(s) {
			return false
		}
		i += j
		if c := s[i+2]; c == 0xa8 || c == 0xa9 {
			return true
		}
	}
}

// htmlEscape is the character s starts with when it is one of
// encoding/json's HTML escapes, else 0.
func htmlEscape(s []byte) byte {
	if len(s) < 6 || string(s[:4]) != `\u00` {
		return 0
	}
	switch string(s[4:6]) {
	case "3c":
		return '<'
	case "3e":
		return '>'
	case "26":
		return '&'
	}
	return 0
}

// canonicalEscape is the length of the escape s starts with when
// AppendString writes that escape for its character, else 0: the short
// forms jsontext writes (\" \\ \b \t \n \f \r), \u00xx in lower case for
// the other control characters, and \u2028 and \u2029.
func canonicalEscape(s []byte) int {
	if len(s) < 2 {
		return 0
	}
	switch s[1] {
	case '"', '\\', 'b', 't', 'n', 'f', 'r':
		return 2
	case 'u':
	default:
		return 0
	}
	if len(s) < 6 {
		return 0
	}
	const hex = "0123456789abcdef"
	v := 0
	for _, h := range s[2:6] {
		d := bytes.IndexByte([]byte(hex), h)
		if d < 0 {
			return 0
		}
		v = v<<4 | d
	}
	switch {
	case v == '\b' || v == '\t' || v == '\n' || v == '\f' || v == '\r':
		return 0 // written in their short form
	case v < 0x20, v == 0x2028, v == 0x2029:
		return 6
	}
	return 0
}
