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

// clipPair is Clip for two versions of one value shown side by side (a
// configuration change): past MaxShownBytes, both start a little before
// their first difference, so the cut never hides what changed.
func clipPair(a, b string) (string, string) {
	if len(a) <= MaxShownBytes && len(b) <= MaxShownBytes {
		return a, b
	}
	same := 0
	for same < len(a) && same < len(b) && a[same] == b[same] {
		same++
	}
	start := max(0, same-MaxShownBytes/4)
	for start > 0 && !utf8.RuneStart(a[start]) {
		start--
	}
	lead := ""
	if start > 0 {
		lead = fmt.Sprintf("[%d bytes alike]...", start)
	}
	return lead + Clip(a[start:], MaxShownBytes), lead + Clip(b[start:], MaxShownBytes)
}
