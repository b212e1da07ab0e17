package source

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/job"
)

// TestDemoData reads the committed demo dataset with the demo job's mapping,
// so the demo keeps showing 600 prompts, 3 dead letters with file:line and
// multi-turn plans: chats regenerated turn by turn and recorded tool round
// trips.
func TestDemoData(t *testing.T) {
	dir := "../../examples/demo"
	spec, err := job.Load(dir + "/job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	glaive, code := spec.Sources[0], spec.Sources[1]
	glaive.Path, code.Path = "data/glaive_fc.jsonl", "data/opencode.parquet"
	samples, bads, st, err := readAll(t, Options{}, glaive, dir)
	if err != nil {
		t.Fatalf("Read glaive: %v", err)
	}
	p := dir + "/data/glaive_fc.jsonl:"
	wantBad := []BadRow{
		{"B1_glaive", p + "43", "", "malformed JSON at byte 205: unexpected end of line"},
		{"B1_glaive", p + "138", "conversations", "field conversations: want array, got string"},
		{"B1_glaive", p + "253", "id", "field id: missing"},
	}
	if diff := cmp.Diff(wantBad, bads); diff != "" {
		t.Errorf("glaive bad rows mismatch (-want +got):\n%s", diff)
	}
	if want := (Stats{Files: 1, Rows: 303, Good: 300, Bad: 3}); st != want {
		t.Errorf("glaive stats = %+v, want %+v", st, want)
	}
	withTools, maxTok := 0, 0
	turns := map[int]int{}
	toolTurns := 0
	for _, s := range samples {
		if strings.Contains(s.Body, `,"tools":[`) {
			withTools++
		}
		if strings.Contains(s.Body, "SYSTEM:") {
			t.Errorf("%s: the SYSTEM: prefix was not stripped: %.120s", s.ID, s.Body)
		}
		p, err := conversation.Decode([]byte(s.Body))
		if err != nil {
			t.Fatalf("%s: %v", s.ID, err)
		}
		turns[p.NumTurns()]++
		if strings.Contains(s.Body, `"calls":[`) {
			toolTurns++
		}
		maxTok = max(maxTok, s.Tokens)
	}
	t.Logf("glaive: %d samples, %d with tools, max %d prompt tokens, turns per sample %v", len(samples), withTools, maxTok, turns)
	if turns[2] == 0 || turns[3] == 0 || toolTurns == 0 {
		t.Errorf("turns per sample %v, %d with a recorded tool round trip; want 2- and 3-turn plans and tool round trips", turns, toolTurns)
	}

	samples, bads, st, err = readAll(t, Options{}, code, dir)
	if err != nil || len(bads) != 0 {
		t.Fatalf("Read opencode: %v, bad rows %v", err, bads)
	}
	if want := (Stats{Files: 1, Rows: 300, Good: 300}); st != want {
		t.Errorf("opencode stats = %+v, want %+v", st, want)
	}
	long := 0
	for _, s := range samples {
		if len(s.Body) > 3000 {
			long++
		}
		maxTok = max(maxTok, s.Tokens)
	}
	if long == 0 {
		t.Errorf("opencode: no prompt over 3000 bytes, want some long ones")
	}
	t.Logf("opencode: %d samples, %d over 3000 bytes", len(samples), long)
}
