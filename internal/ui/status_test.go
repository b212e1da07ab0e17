package ui

import (
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestStatusNamesRejectedFile: the rejects line names the real file, not a
// placeholder (issue 21).
func TestStatusNamesRejectedFile(t *testing.T) {
	r := monitor.Report{State: monitor.Done, Rejects: []monitor.RuleCount{{Rule: "truncated", N: 19}}, RejectedFile: "out/demo.rejected.jsonl"}
	text := StatusText("demo", r)
	want := "rejected by rule: truncated 19 (exported to out/demo.rejected.jsonl with the evidence;"
	if !strings.Contains(text, want) {
		t.Errorf("status text lacks %q:\n%s", want, text)
	}
	if strings.Contains(text, "<name>") {
		t.Errorf("status text has a placeholder:\n%s", text)
	}
}
