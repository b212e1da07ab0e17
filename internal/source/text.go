package source

import (
	"bytes"
	"fmt"
	"unicode/utf8"
)

// Text that is not valid Unicode is refused, not repaired: Go's JSON
// decoder silently turns invalid UTF-8 and lone UTF-16 surrogates into
// U+FFFD, so a prompt would be sent, and exported, altered without a word.
// The row becomes a dead letter naming the byte, for the user to fix.

// invalidText returns why a JSONL line holds text that is not valid
// Unicode ("" when it is all valid): a byte that is not UTF-8, or a \u
// escape of a surrogate without its pair. Offsets count from 1 within the
// line, as columns do.
func invalidText(line []byte) string {
	if !utf8.Valid(line) {
		i := firstInvalidUTF8(line)
		return fmt.Sprintf("invalid UTF-8 at byte %d (0x%02x): the text would be altered, not sent as written; fix the file's encoding", i+1, line[i])
	}
	if i := loneSurrogate(line); i >= 0 {
		return fmt.Sprintf("lone UTF-16 surrogate %s at byte %d: not a character, the text would be altered, not sent as written; fix the escape", line[i:i+6], i+1)
	}
	return ""
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return -1
}

// loneSurrogate returns the offset of the first \uXXXX escape of a UTF-16
// surrogate that is not a high surrogate followed by a low one, -1 when
// there is none. Backslashes appear only inside JSON strings, and an
// escaped backslash (\\) is skipped whole, so \\ud800 is plain text.
func loneSurrogate(line []byte) int {
	if !bytes.Contains(line, []byte(`\u`)) {
		return -1
	}
	for i := 0; i < len(line)-1; i++ {
		if line[i] != '\\' {
			continue
		}
		if line[i+1] != 'u' {
			i++ // an escape of one character, \\ included
			continue
		}
		u, ok := hex4(line, i+2)
		switch {
		case !ok: // malformed: the decoder says so
		case u >= 0xD800 && u < 0xDC00:
			low, ok := hex4(line, i+8)
			if i+7 >= len(line) || line[i+6] != '\\' || line[i+7] != 'u' || !ok || low < 0xDC00 || low > 0xDFFF {
				return i
			}
			i += 11 // the pair
			continue
		case u >= 0xDC00 && u <= 0xDFFF:
			return i
		}
		i += 5
	}
	return -1
}

// hex4 reads four hex digits at b[at:].
func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// invalidString finds a string in a decoded Parquet row value that is not
// valid UTF-8 (a Parquet string has no escapes, so a surrogate shows as
// invalid bytes): the field path and the reason, "" when all are valid.
func invalidString(v any, field string) (string, string) {
	switch x := v.(type) {
	case string:
		if !utf8.ValidString(x) {
			i := firstInvalidUTF8([]byte(x))
			return field, fmt.Sprintf("invalid UTF-8 at byte %d of field %s (0x%02x): the text would be altered, not sent as written; fix the file's encoding", i+1, field, x[i])
		}
	case map[string]any:
		for k, e := range x {
			if f, reason := invalidString(e, joinField(field, k)); reason != "" {
				return f, reason
			}
		}
	case []any:
		for i, e := range x {
			if f, reason := invalidString(e, fmt.Sprintf("%s[%d]", field, i)); reason != "" {
				return f, reason
			}
		}
	}
	return "", ""
}

func joinField(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}
