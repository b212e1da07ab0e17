package source

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/regen-dev/regen/internal/job"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenSample is one sample as testdata/bodies.golden records it. Small
// fixtures keep the body itself; the demo dataset only its SHA-256.
type goldenSample struct {
	Case       string          `json:"case"`
	ID         string          `json:"id"`
	Tokens     int             `json:"tokens"`
	BodySHA256 string          `json:"body_sha256"`
	Body       json.RawMessage `json:"body,omitempty"`
}

// goldenCases are the sources TestBodyGolden reads: every mapping, both
// regeneration modes, tools as arrays and glaive strings, recorded tool
// calls with and without ids, content parts, samples_per_prompt copies
// (with and without an id field), and the committed demo dataset.
func goldenCases(t *testing.T) []struct {
	name, dir string
	src       job.Source
	full      bool // record whole bodies
} {
	t.Helper()
	spec, err := job.Load("../../examples/demo/job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	glaive, code := spec.Sources[0], spec.Sources[1]
	glaive.Path, code.Path = "data/glaive_fc.jsonl", "data/opencode.parquet"
	glaiveLast, glaiveNoID := glaive, glaive
	glaiveLast.Regenerate, glaiveNoID.ID = job.RegenerateLast, ""
	glaiveCopies := glaive
	glaiveCopies.SamplesPerPrompt, glaiveCopies.Limit = 2, 40

	sg := job.Source{Partition: "B1", Path: "sharegpt.jsonl", Conversations: "conversations", Tools: "tools", ID: "id", SystemField: "system"}
	sgLast := sg
	sgLast.Regenerate = job.RegenerateLast
	sgCopies := sg
	sgCopies.SamplesPerPrompt = 3
	oa := job.Source{Partition: "O", Path: "openai.jsonl", Messages: "messages"}
	oaLast := oa
	oaLast.Regenerate = job.RegenerateLast
	shapes := job.Source{Partition: "S", Path: "shapes_openai.jsonl", Messages: "messages", Tools: "tools"}
	shapesLast := shapes
	shapesLast.Regenerate = job.RegenerateLast
	shapesCopies := shapes
	shapesCopies.SamplesPerPrompt = 2
	glaiveShapes := job.Source{Partition: "G", Path: "shapes_sharegpt.jsonl", Conversations: "conversations", Tools: "tools",
		SystemField: "system", StripSystemPrefix: "SYSTEM:"}
	glaiveShapesLast := glaiveShapes
	glaiveShapesLast.Regenerate = job.RegenerateLast
	prompt := job.Source{Partition: "P", Path: "prompt.jsonl", Prompt: "input", ID: "task_id", System: "You write code."}
	promptNoID := job.Source{Partition: "P", Path: "prompt.jsonl", Prompt: "input"}
	promptCopies := promptNoID
	promptCopies.SamplesPerPrompt = 2

	demo := "../../examples/demo"
	return []struct {
		name, dir string
		src       job.Source
		full      bool
	}{
		{"sharegpt", "testdata", sg, true},
		{"sharegpt last", "testdata", sgLast, true},
		{"sharegpt copies", "testdata", sgCopies, true},
		{"openai", "testdata", oa, true},
		{"openai last", "testdata", oaLast, true},
		{"openai shapes", "testdata", shapes, true},
		{"openai shapes last", "testdata", shapesLast, true},
		{"openai shapes copies", "testdata", shapesCopies, true},
		{"glaive shapes", "testdata", glaiveShapes, true},
		{"glaive shapes last", "testdata", glaiveShapesLast, true},
		{"prompt", "testdata", prompt, true},
		{"prompt hash ids", "testdata", promptNoID, true},
		{"prompt copies", "testdata", promptCopies, true},
		{"demo glaive", demo, glaive, false},
		{"demo glaive last", demo, glaiveLast, false},
		{"demo glaive hash ids", demo, glaiveNoID, false},
		{"demo glaive copies", demo, glaiveCopies, false},
		{"demo opencode", demo, code, false},
	}
}

// TestBodyGolden: sample ids are the SHA-256 of the body bytes, so the
// bytes every mapping writes are pinned: a change to the encoder that
// moves a key, escapes a character or drops an empty field changes ids
// and fails here. Run with -update only for a deliberate format change.
func TestBodyGolden(t *testing.T) {
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	for _, c := range goldenCases(t) {
		_, err := Options{}.Read(context.Background(), c.src, c.dir, func(s Sample) error {
			sum := sha256.Sum256(s.Body)
			g := goldenSample{Case: c.name, ID: s.ID, Tokens: s.PromptTokens, BodySHA256: hex.EncodeToString(sum[:])}
			if c.full {
				g.Body = s.Body
			}
			return enc.Encode(g)
		}, func(BadRow) error { return nil })
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	const path = "testdata/bodies.golden"
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	gotLines, wantLines := bytes.Split(out.Bytes(), []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := range max(len(gotLines), len(wantLines)) {
		var g, w []byte
		if i < len(gotLines) {
			g = gotLines[i]
		}
		if i < len(wantLines) {
			w = wantLines[i]
		}
		if !bytes.Equal(g, w) {
			t.Fatalf("%s line %d differs:\n got %s\nwant %s", path, i+1, g, w)
		}
	}
	if len(gotLines) < 1300 {
		t.Errorf("%d samples recorded, want the demo's 300 rows in each of its cases", len(gotLines))
	}
	// The file covers every key and the tool-call id written even when empty.
	for _, key := range []string{`"tools":`, `"turns":`, `"calls":`, `"original":`, `"seed":`, `"id":""`, `"tool_call_id":`, `"name":"ann"`, `\u2028`, `"content":[`} {
		if !bytes.Contains(want, []byte(key)) {
			t.Errorf("%s has no body with %s; want every shape covered", path, key)
		}
	}
}
