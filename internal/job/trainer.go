package job

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Trainers output.trainer names (docs/training-data.md, "Trainer
// profiles"). Unset, the training files have the layout both read.
const (
	TrainerSpeculators = "speculators"
	TrainerSpecForge   = "specforge"
)

// Trainers lists the profiles output.trainer takes.
var Trainers = []string{TrainerSpeculators, TrainerSpecForge}

// specForgeReserved are names a SpecForge row cannot carry as a column:
// its online loader hands every column but conversations, id and tools
// to Parser.parse and on to apply_chat_template as keyword arguments
// (sgl-project/SpecForge a6b6b02 specforge/data/preprocessing.py
// l.150-165, 285-294; parse.py l.187-195, 136-143), so a column of one of
// these names collides with an argument of theirs.
var specForgeReserved = []string{"conversation", "max_length", "preformatted", "train_only_last_turn", "tool",
	"messages", "tokenize", "add_generation_prompt", "tools", "add_special_tokens", "id", "conversations",
	"source_id", "assistant_turn_index", "input_ids", "loss_mask"}

// HarmonyModel reports whether model is served with OpenAI's harmony
// format (gpt-oss), whose SpecForge template takes harmony roles
// (assistant_analysis, assistant_final) instead of assistant. The job's
// model name is what regen knows of the template family.
func HarmonyModel(model string) bool {
	return strings.Contains(strings.ToLower(model), "gpt-oss")
}

// TemplateSwitches are the chat_template_kwargs keys the job's requests
// send (generation.chat_template_kwargs, and the thinking switches that
// reasoning: disable adds), sorted.
func (g Generation) TemplateSwitches() []string {
	keys := map[string]bool{}
	for k := range g.chatTemplateKwargs() {
		keys[k] = true
	}
	if g.Reasoning == ReasoningDisable {
		for _, k := range thinkingKeys {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

// trainer checks output.trainer against the rest of the job.
func (v *validator) trainer() {
	s := v.s
	o := s.Output
	switch o.Trainer {
	case "", TrainerSpeculators:
		return
	case TrainerSpecForge:
	default:
		v.addf("output.trainer", "unknown trainer %q (want %s, or unset for the layout both read)", o.Trainer, strings.Join(Trainers, " or "))
		return
	}
	if o.Metadata == MetadataFull {
		v.addf("output.metadata", "full adds run-detail columns, and SpecForge hands every column to the chat template (gpt-oss's parser refuses them); export them with output.trainer unset")
	}
	if o.TokenIDs && o.TokenRows != TokenRowsTurn {
		v.addf("output.token_rows", "SpecForge rows are one per assistant turn, so their ids are too: set turn (the default with output.trainer: specforge)")
	}
	for _, k := range s.Generation.TemplateSwitches() {
		if slices.Contains(specForgeReserved, k) {
			v.addf("generation.chat_template_kwargs", "%q would be a column of SpecForge's rows, and SpecForge passes columns as arguments of its own of that name; rename it or leave output.trainer unset", k)
		}
	}
	if !HarmonyModel(s.Model) {
		return
	}
	// SpecForge's gpt-oss parser has no role for a tool call or a tool
	// result (parse.py l.358-385).
	for i, src := range s.Sources {
		if src.Tools != "" {
			v.addf(fmt.Sprintf("sources[%d].tools", i), "SpecForge's gpt-oss template has no role for tool calls or tool results; export this job with output.trainer unset or speculators")
		}
	}
}
