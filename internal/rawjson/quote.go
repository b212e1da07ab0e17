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
