package job

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestTrainerProfile: output.trainer takes speculators or specforge;
// SpecForge's rows are turns (token_rows defaults to turn with token ids
// and refuses conversation), carry no run details and no switch named like
// an argument of SpecForge's, and a gpt-oss job's sources map no tools.
// The profile changes the export alone: one fingerprint for all.
func TestTrainerProfile(t *testing.T) {
	const base = "name: g\nmodel: %s\nsources: [{partition: a, path: a.jsonl, %s}]\nendpoints: [{url: \"http://localhost:8000\"}]\n"
	tests := []struct {
		model, source, tail string
		rows                string
		err                 []string
	}{
		{"qwen", "prompt: p", "output: {trainer: speculators, token_ids: true}", TokenRowsConversation, nil},
		{"qwen", "prompt: p", "output: {trainer: specforge, token_ids: true}", TokenRowsTurn, nil},
		{"qwen", "prompt: p", "output: {trainer: specforge}", TokenRowsConversation, nil},
		{"qwen", "prompt: p", "output: {trainer: axolotl}", "", []string{`job.yaml:5: output.trainer: unknown trainer "axolotl" (want speculators or specforge, or unset for the layout both read)`}},
		{"qwen", "prompt: p", "output: {trainer: specforge, token_ids: true, token_rows: conversation}", "",
			[]string{`job.yaml:5: output.token_rows: SpecForge rows are one per assistant turn, so their ids are too: set turn (the default with output.trainer: specforge)`}},
		{"qwen", "prompt: p", "output: {trainer: specforge, metadata: full}", "",
			[]string{`job.yaml:5: output.metadata: full adds run-detail columns, and SpecForge hands every column to the chat template (gpt-oss's parser refuses them); export them with output.trainer unset`}},
		{"qwen", "prompt: p", "generation: {chat_template_kwargs: {tool: x}}\noutput: {trainer: specforge}", "",
			[]string{`job.yaml:5: generation.chat_template_kwargs: "tool" would be a column of SpecForge's rows, and SpecForge passes columns as arguments of its own of that name; rename it or leave output.trainer unset`}},
		{"openai/gpt-oss-120b", "preset: glaive", "output: {trainer: specforge}", "",
			[]string{`job.yaml:3: sources[0].tools: SpecForge's gpt-oss template has no role for tool calls or tool results; export this job with output.trainer unset or speculators`}},
		{"openai/gpt-oss-120b", "preset: glaive", "output: {trainer: speculators}", TokenRowsConversation, nil},
	}
	var fps []string
	for _, tt := range tests {
		src := []byte(fmt.Sprintf(base, tt.model, tt.source) + tt.tail + "\n")
		s, err := Parse("job.yaml", src)
		if tt.err != nil {
			if diff := cmp.Diff(tt.err, errLines(err)); diff != "" {
				t.Errorf("%s: errors (-want +got):\n%s", tt.tail, diff)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.tail, err)
		}
		if s.Output.TokenRows != tt.rows {
			t.Errorf("%s: token_rows %q, want %q", tt.tail, s.Output.TokenRows, tt.rows)
		}
		if tt.source == "prompt: p" {
			fp, err := s.Fingerprint()
			if err != nil {
				t.Fatal(err)
			}
			fps = append(fps, fp.Hash)
		}
	}
	if len(fps) != 3 || fps[0] != fps[1] || fps[1] != fps[2] {
		t.Errorf("fingerprints %v: want one, the profile changes no request", fps)
	}
}

func TestHarmonyModelAndSwitches(t *testing.T) {
	for model, want := range map[string]bool{"openai/gpt-oss-20b": true, "GPT-OSS-120B": true, "Qwen/Qwen3-8B": false, "deepseek-ai/DeepSeek-V3.1": false} {
		if HarmonyModel(model) != want {
			t.Errorf("HarmonyModel(%q) = %v", model, !want)
		}
	}
	g := Generation{ChatTemplateKwargs: map[string]any{"thinking": true, "effort": "high"}}
	if got := g.TemplateSwitches(); !slices.Equal(got, []string{"effort", "thinking"}) {
		t.Errorf("switches %v", got)
	}
	g = Generation{Reasoning: ReasoningDisable}
	if got := g.TemplateSwitches(); !slices.Equal(got, []string{"enable_thinking", "thinking"}) {
		t.Errorf("disable's switches %v, want both thinking switches its requests send", got)
	}
}
