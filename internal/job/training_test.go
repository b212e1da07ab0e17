package job

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTrainingOptionErrors(t *testing.T) {
	_, err := Load("testdata/training_invalid.yaml")
	want := []string{
		`testdata/training_invalid.yaml:3: sources[0]: set exactly one of conversations, messages or prompt (got 0)`,
		`testdata/training_invalid.yaml:5: sources[0].preset: unknown preset "alpaca" (want glaive)`,
		`testdata/training_invalid.yaml:6: sources[0].regenerate: unknown mode "first" (want all or last)`,
		`testdata/training_invalid.yaml:12: generation.reasoning: disable contradicts chat_template_kwargs.enable_thinking: true; keep one`,
		`testdata/training_invalid.yaml:15: output.metadata: unknown level "some" (want minimal or full)`,
		`testdata/training_invalid.yaml:17: retry.poison_after: must be >= 0 (0 turns the guard off)`,
		`testdata/training_invalid.yaml:19: quality.repetition.ngram: must be >= 1`,
		`testdata/training_invalid.yaml:19: quality.repetition.max_repeats: must be >= 0 (0 turns the rule off)`,
		"testdata/training_invalid.yaml:21: quality.regex[0].pattern: error parsing regexp: missing closing ): `(unclosed`",
		`testdata/training_invalid.yaml:22: quality.regex[1].name: "r" is used twice`,
		`testdata/training_invalid.yaml:22: quality.regex[1].field: unknown field "title" (want content, reasoning or any)`,
		`testdata/training_invalid.yaml:23: quality.regex[2].pattern: required`,
	}
	if diff := cmp.Diff(want, errLines(err)); diff != "" {
		t.Errorf("errors mismatch (-want +got):\n%s", diff)
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Errorf("error is not a *FieldError: %T", err)
	}
}

func TestGlaivePresetFieldsWin(t *testing.T) {
	src := `name: g
sources:
  - {partition: a, path: a.jsonl, preset: glaive}
  - {partition: b, path: b.jsonl, preset: glaive, conversations: chat, tools: "", system: "Be brief.", strip_system_prefix: ""}
endpoints: [{url: "http://localhost:8000"}]
`
	s, err := Parse("job.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Sources[0], s.Sources[1]
	if a.Conversations != "conversations" || a.Tools != "tools" || a.SystemField != "system" || a.StripSystemPrefix != "SYSTEM:" || a.Regenerate != "all" {
		t.Errorf("glaive preset = %+v", a)
	}
	if b.Conversations != "chat" || b.Tools != "" || b.SystemField != "" || b.System != "Be brief." || b.StripSystemPrefix != "" {
		t.Errorf("preset with fields written = %+v; want the written fields to win", b)
	}
}

func TestReasoningModes(t *testing.T) {
	tests := []struct {
		name    string
		gen     Generation
		asked   bool
		wantKwa map[string]any // chat_template_kwargs sent; nil = none
	}{
		{"thinking asked", Generation{Reasoning: "strip_history", ChatTemplateKwargs: map[string]any{"thinking": true}}, true, map[string]any{"thinking": true}},
		{"qwen switch in extra", Generation{Reasoning: "keep", Extra: map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": true}}}, true, map[string]any{"enable_thinking": true}},
		{"no switch", Generation{Reasoning: "keep"}, false, nil},
		{"switch off", Generation{Reasoning: "keep", ChatTemplateKwargs: map[string]any{"enable_thinking": false}}, false, map[string]any{"enable_thinking": false}},
		{"disable sets both switches and keeps the rest", Generation{Reasoning: "disable", ChatTemplateKwargs: map[string]any{"custom": "x"}}, false,
			map[string]any{"custom": "x", "thinking": false, "enable_thinking": false}},
		{"disable alone", Generation{Reasoning: "disable"}, false, map[string]any{"thinking": false, "enable_thinking": false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.gen.ReasoningAsked(); got != tt.asked {
				t.Errorf("ReasoningAsked = %v, want %v", got, tt.asked)
			}
			params, err := tt.gen.Params()
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if raw, ok := params["chat_template_kwargs"]; ok {
				if err := json.Unmarshal(raw, &got); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tt.wantKwa, got); diff != "" {
				t.Errorf("chat_template_kwargs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTokenRows: output.token_rows defaults to conversation, takes turn
// only with token ids, names its modes when wrong, and changes the export
// alone: the configuration fingerprint stays the same.
func TestTokenRows(t *testing.T) {
	const base = "name: g\nsources: [{partition: a, path: a.jsonl, prompt: p}]\nendpoints: [{url: \"http://localhost:8000\"}]\n"
	tests := []struct {
		output, want, err string
	}{
		{"output: {token_ids: true}", TokenRowsConversation, ""},
		{"output: {token_ids: true, token_rows: turn}", TokenRowsTurn, ""},
		{"output: {token_rows: turn}", "", `job.yaml:4: output.token_rows: turn rows are rows of token ids; set output.token_ids: true`},
		{"output: {token_ids: true, token_rows: turns}", "", `job.yaml:4: output.token_rows: unknown mode "turns" (want conversation or turn)`},
	}
	var fps []string
	for _, tt := range tests {
		s, err := Parse("job.yaml", []byte(base+tt.output+"\n"))
		if tt.err != "" {
			if diff := cmp.Diff([]string{tt.err}, errLines(err)); diff != "" {
				t.Errorf("%s: errors (-want +got):\n%s", tt.output, diff)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.output, err)
		}
		if s.Output.TokenRows != tt.want {
			t.Errorf("%s: token_rows %q, want %q", tt.output, s.Output.TokenRows, tt.want)
		}
		fp, err := s.Fingerprint()
		if err != nil {
			t.Fatal(err)
		}
		fps = append(fps, fp.Hash)
	}
	if len(fps) != 2 || fps[0] != fps[1] {
		t.Errorf("fingerprints %v: want one, token_rows changes no request", fps)
	}
}
