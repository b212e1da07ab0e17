package job

import (
	"fmt"
	"unicode/utf8"
)

// MaxShownBytes is the most of one value a message or a summary shows: a
// job file may hold a megabyte string, and printing it whole once filled a
// terminal with 315 MB.
const MaxShownBytes = 160

// maxMessageBytes bounds a whole problem's message, which may quote a value
// beside its own words.
const maxMessageBytes = 4 * MaxShownBytes

// Clip returns s when it is at most n bytes, else its first n bytes (whole
// runes) and a marker saying how much was left out.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s...[%d more bytes]", s[:cut], len(s)-cut)
}
