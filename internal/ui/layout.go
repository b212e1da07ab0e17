package ui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"
)

// The watch view is laid out for the terminal it has: nothing is cut
// silently. Text lines wrap at word boundaries (continuation lines
// indented); the progress table keeps every column, giving up first the
// bar, then full header words (abbreviated, with a legend), then the
// percentage, then the width of long partition names (shortened with …).

// wrap breaks a (styled) line into lines of at most width cells; the
// continuation lines are indented by indent spaces.
func wrap(line string, width, indent int) []string {
	if ansi.StringWidth(line) <= width {
		return []string{line}
	}
	first, rest := splitAt(line, width)
	out := []string{first}
	pad := strings.Repeat(" ", indent)
	for rest != "" {
		var l string
		l, rest = splitAt(rest, width-indent)
		out = append(out, pad+l)
	}
	return out
}

// splitAt returns the first line of s wrapped to width (at a space when
// there is one, mid-word otherwise) and what is left of s.
func splitAt(s string, width int) (string, string) {
	width = max(width, 8)
	if ansi.StringWidth(s) <= width {
		return s, ""
	}
	w := ansi.Wrap(s, width, " ")
	first, rest, _ := strings.Cut(w, "\n")
	// Wrap's output lines are s's text in order: the rest of s starts
	// after as many visible cells as the first line holds (plus the space
	// it broke at).
	n := ansi.StringWidth(strings.TrimRight(ansi.Strip(first), " "))
	tail := ansi.Cut(s, n, ansi.StringWidth(s))
	tail = strings.TrimLeft(tail, " ")
	if rest == "" {
		tail = ""
	}
	return strings.TrimRight(first, " "), tail
}

// wrapParts joins parts with two spaces into lines of at most width
// cells, breaking only between parts (a part too long for a line of its
// own is wrapped); continuation lines are indented by indent spaces.
func wrapParts(parts []string, width, indent int) []string {
	var out []string
	cur := ""
	for _, p := range parts {
		switch {
		case cur == "":
			cur = p
		case ansi.StringWidth(cur)+2+ansi.StringWidth(p) <= width:
			cur += "  " + p
		default:
			out = append(out, wrap(cur, width, indent)...)
			cur = strings.Repeat(" ", indent) + p
		}
	}
	return append(out, wrap(cur, width, indent)...)
}

// wrapAll wraps every line of ls.
func wrapAll(ls []string, width, indent int) []string {
	var out []string
	for _, l := range ls {
		out = append(out, wrap(l, width, indent)...)
	}
	return out
}

// column is one column of a table: its header, the abbreviation used when
// the terminal is narrow, and one cell per row.
type column struct {
	head, short string
	left        bool
	cells       []string
	width       int
}

func (c *column) measure(abbrev bool) {
	c.width = ansi.StringWidth(c.title(abbrev))
	for _, s := range c.cells {
		c.width = max(c.width, ansi.StringWidth(s))
	}
}

func (c *column) title(abbrev bool) string {
	if abbrev && c.short != "" {
		return c.short
	}
	return c.head
}

func (c *column) pad(s string) string {
	gap := max(0, c.width-ansi.StringWidth(s))
	if c.left {
		return s + strings.Repeat(" ", gap)
	}
	return strings.Repeat(" ", gap) + s
}

// tableGap separates columns.
const tableGap = "  "

// table lays out the name column, the other columns and, when there is
// room for one at least minBar cells wide, a bar per row drawn by bars
// (nil: no bar column) after the name. It returns the header, the rows and
// a legend of the abbreviations used ("" when none).
func table(name column, cols []column, bars func(row, width int) string, width int) (head string, rows []string, legend string) {
	const minBar, maxBar = 10, 40
	abbrev, dropPct := false, false
	var used []column
	need := func() int {
		used = used[:0]
		name.measure(abbrev)
		n := name.width
		for _, c := range cols {
			if dropPct && c.head == "%" {
				continue
			}
			c.measure(abbrev)
			used = append(used, c)
			n += len(tableGap) + c.width
		}
		return n
	}
	n := need()
	if n > width {
		abbrev = true
		n = need()
	}
	if n > width {
		dropPct = true
		n = need()
	}
	if n > width {
		// Shorten the names, never below 8 cells.
		name.width = max(8, name.width-(n-width))
		n = width
		for i, s := range name.cells {
			name.cells[i] = ansi.Truncate(s, name.width, "…")
		}
	}
	barW := 0
	if bars != nil && width-n-len(tableGap)-2 >= minBar {
		barW = min(maxBar, width-n-len(tableGap)-2)
	}
	line := func(nameCell string, row int, cell func(c column) string) string {
		var b strings.Builder
		b.WriteString(name.pad(nameCell))
		if barW > 0 {
			b.WriteString(tableGap)
			if row < 0 {
				b.WriteString(fmt.Sprintf("%-*s", barW+2, "progress"))
			} else {
				b.WriteString(bars(row, barW))
			}
		}
		for _, c := range used {
			b.WriteString(tableGap + c.pad(cell(c)))
		}
		return b.String()
	}
	head = line(name.title(abbrev), -1, func(c column) string { return c.title(abbrev) })
	for i := range name.cells {
		rows = append(rows, line(name.cells[i], i, func(c column) string { return c.cells[i] }))
	}
	if abbrev {
		var parts []string
		for _, c := range used {
			if c.short != "" {
				parts = append(parts, c.short+" = "+c.head)
			}
		}
		legend = strings.Join(parts, ", ")
	}
	return head, rows, legend
}
