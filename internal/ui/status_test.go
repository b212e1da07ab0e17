package ui

import (
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestStatusNamesRejectedFile: the rejects line names the real file, not a
// placeholder (issue 21).
func TestStatusNamesRejectedFile(t *testing.T) {
	r := monitor.Report{State: monitor.Done, Rejects: []monitor.RuleCount{{Rule: "truncated", N: 19}}, RejectedFile: "out/demo.rejected.jsonl", RejectedExported: 19}
	text := StatusText("demo", r)
	want := "rejected by rule: truncated 19 (exported to out/demo.rejected.jsonl with the evidence;"
	if !strings.Contains(text, want) {
		t.Errorf("status text lacks %q:\n%s", want, text)
	}
	if strings.Contains(text, "<name>") {
		t.Errorf("status text has a placeholder:\n%s", text)
	}
}

// TestStatusRejectsNotExported: after a run stopped before its export, the
// rejects line does not claim a file holds them (issue 30 item 8); after a
// partial export it says how many.
func TestStatusRejectsNotExported(t *testing.T) {
	for _, tc := range []struct {
		exported int
		want     string
	}{
		{0, "rejected by rule: truncated 19 (not exported yet: `regen export` writes them to out/demo.rejected.jsonl with the evidence;"},
		{7, "rejected by rule: truncated 19 (7 of them exported to out/demo.rejected.jsonl with the evidence, the rest at the next export;"},
	} {
		r := monitor.Report{State: monitor.Done, Rejects: []monitor.RuleCount{{Rule: "truncated", N: 19}}, RejectedFile: "out/demo.rejected.jsonl", RejectedExported: tc.exported}
		text := StatusText("demo", r)
		if !strings.Contains(text, tc.want) {
			t.Errorf("exported %d: status text lacks %q:\n%s", tc.exported, tc.want, text)
		}
		if strings.Contains(text, "(exported to") {
			t.Errorf("exported %d: status claims the export holds them:\n%s", tc.exported, text)
		}
	}
}
