package job

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Presets a source can name.
const PresetGlaive = "glaive"

// Presets lists the known presets.
var Presets = []string{PresetGlaive}

// Regeneration modes of a source.
const (
	RegenerateAll  = "all"
	RegenerateLast = "last"
)

// Reasoning modes.
const (
	ReasoningKeep         = "keep"
	ReasoningStripHistory = "strip_history"
	ReasoningDisable      = "disable"
)

// Metadata levels of the export.
const (
	MetadataMinimal = "minimal"
	MetadataFull    = "full"
)

// Token row modes of the export (output.token_rows).
const (
	TokenRowsConversation = "conversation"
	TokenRowsTurn         = "turn"
)

// Defaults of the options in this file.
const (
	DefaultRegenerate     = RegenerateAll
	DefaultReasoning      = ReasoningStripHistory
	DefaultMetadata       = MetadataMinimal
	DefaultTokenRows      = TokenRowsConversation
	DefaultPoisonAfter    = 10
	DefaultBrokenStreak   = 10
	DefaultRepetitionGram = 10
	DefaultMaxRepeats     = 20
	glaiveSystemPrefix    = "SYSTEM:"
)

// Quality holds the reject rules. Every rule is on unless the file turns it
// off; see package quality for what each one checks.
type Quality struct {
	Truncated  bool        `yaml:"truncated"`
	Empty      bool        `yaml:"empty"`
	Reasoning  bool        `yaml:"reasoning"`
	ThinkTags  bool        `yaml:"think_tags"`
	ToolArgs   bool        `yaml:"tool_args"`
	ToolName   bool        `yaml:"tool_name"`
	Repetition Repetition  `yaml:"repetition"`
	Regex      []RegexRule `yaml:"regex"`
}

// Repetition configures the degenerate-loop rule.
type Repetition struct {
	NGram      int `yaml:"ngram"`       // words per run; default 10
	MaxRepeats int `yaml:"max_repeats"` // a run occurring more often is a loop; default 20; 0 = off
}

// RegexRule rejects answers a pattern matches.
type RegexRule struct {
	Name    string `yaml:"name"`
	Pattern string `yaml:"pattern"` // Go regexp syntax (RE2)
	Field   string `yaml:"field"`   // content | reasoning | any; default content
}

// applyTrainingDefaults fills presets and the defaults of this file's options.
func (s *Spec) applyTrainingDefaults() {
	for i := range s.Sources {
		src := &s.Sources[i]
		p := fmt.Sprintf("sources[%d]", i)
		if src.Preset == PresetGlaive {
			if src.Conversations == "" && src.Messages == "" && src.Prompt == "" {
				src.Conversations = "conversations"
			}
			if src.Tools == "" && s.unset(p+".tools") {
				src.Tools = "tools"
			}
			if src.SystemField == "" && src.System == "" && s.unset(p+".system_field") {
				src.SystemField = "system"
			}
			if src.StripSystemPrefix == "" && s.unset(p+".strip_system_prefix") {
				src.StripSystemPrefix = glaiveSystemPrefix
			}
		}
		if src.Regenerate == "" {
			src.Regenerate = DefaultRegenerate
		}
	}
	if s.Generation.Reasoning == "" {
		s.Generation.Reasoning = DefaultReasoning
	}
	if s.Output.Metadata == "" {
		s.Output.Metadata = DefaultMetadata
	}
	if s.Output.TokenRows == "" {
		s.Output.TokenRows = DefaultTokenRows
		if s.Output.Trainer == TrainerSpecForge && s.Output.TokenIDs {
			s.Output.TokenRows = TokenRowsTurn // SpecForge's rows are turns
		}
	}
	setInt(s, &s.Retry.PoisonAfter, "retry.poison_after", DefaultPoisonAfter)
	setInt(s, &s.Retry.BrokenStreak, "retry.broken_streak", DefaultBrokenStreak)
	q := &s.Quality
	for _, b := range []struct {
		v    *bool
		path string
	}{{&q.Truncated, "truncated"}, {&q.Empty, "empty"}, {&q.Reasoning, "reasoning"}, {&q.ThinkTags, "think_tags"},
		{&q.ToolArgs, "tool_args"}, {&q.ToolName, "tool_name"}} {
		if s.unset("quality." + b.path) {
			*b.v = true
		}
	}
	setInt(s, &q.Repetition.NGram, "quality.repetition.ngram", DefaultRepetitionGram)
	setInt(s, &q.Repetition.MaxRepeats, "quality.repetition.max_repeats", DefaultMaxRepeats)
	for i := range q.Regex {
		if q.Regex[i].Field == "" {
			q.Regex[i].Field = "content"
		}
		if q.Regex[i].Name == "" {
			q.Regex[i].Name = fmt.Sprintf("regex%d", i)
		}
	}
}

// validateTraining checks the options of this file.
func (v *validator) training() {
	s := v.s
	for i, src := range s.Sources {
		p := fmt.Sprintf("sources[%d]", i)
		if src.Preset != "" && !slices.Contains(Presets, src.Preset) {
			v.addf(p+".preset", "unknown preset %q (want %s)", src.Preset, strings.Join(Presets, ", "))
		}
		if src.Regenerate != RegenerateAll && src.Regenerate != RegenerateLast {
			v.addf(p+".regenerate", "unknown mode %q (want all or last)", src.Regenerate)
		}
	}
	g := s.Generation
	switch g.Reasoning {
	case ReasoningKeep, ReasoningStripHistory:
	case ReasoningDisable:
		kw := g.chatTemplateKwargs()
		for _, k := range thinkingKeys {
			if on, ok := kw[k].(bool); ok && on {
				v.addf("generation.reasoning", "disable contradicts chat_template_kwargs.%s: true; keep one", k)
			}
		}
	default:
		v.addf("generation.reasoning", "unknown mode %q (want keep, strip_history or disable)", g.Reasoning)
	}
	if m := s.Output.Metadata; m != MetadataMinimal && m != MetadataFull {
		v.addf("output.metadata", "unknown level %q (want minimal or full)", m)
	}
	switch r := s.Output.TokenRows; {
	case r != TokenRowsConversation && r != TokenRowsTurn:
		v.addf("output.token_rows", "unknown mode %q (want conversation or turn)", r)
	case r == TokenRowsTurn && !s.Output.TokenIDs:
		v.addf("output.token_rows", "turn rows are rows of token ids; set output.token_ids: true")
	}
	v.trainer()
	if s.Retry.PoisonAfter < 0 {
		v.addf("retry.poison_after", "must be >= 0 (0 turns the guard off)")
	}
	if s.Retry.BrokenStreak < 0 {
		v.addf("retry.broken_streak", "must be >= 0 (0 turns the guard off)")
	}
	q := s.Quality
	if q.Repetition.NGram < 1 {
		v.addf("quality.repetition.ngram", "must be >= 1")
	}
	if q.Repetition.MaxRepeats < 0 {
		v.addf("quality.repetition.max_repeats", "must be >= 0 (0 turns the rule off)")
	}
	names := map[string]bool{}
	for i, r := range q.Regex {
		p := fmt.Sprintf("quality.regex[%d]", i)
		if names[r.Name] {
			v.addf(p+".name", "%q is used twice", r.Name)
		}
		names[r.Name] = true
		if r.Pattern == "" {
			v.addf(p+".pattern", "required")
		} else if _, err := regexp.Compile(r.Pattern); err != nil {
			v.addf(p+".pattern", "%v", err)
		}
		if !slices.Contains([]string{"content", "reasoning", "any"}, r.Field) {
			v.addf(p+".field", "unknown field %q (want content, reasoning or any)", r.Field)
		}
	}
}

// thinkingKeys are the chat-template switches for thinking: "thinking"
// (DeepSeek-V3.1/V3.2, Kimi K2.5) and "enable_thinking" (Qwen3 and others).
// Jinja templates ignore variables they do not use, so setting both is
// safe; see docs/training-data.md.
var thinkingKeys = []string{"thinking", "enable_thinking"}

// chatTemplateKwargs returns the chat_template_kwargs the job sends, from
// either place it can be written.
func (g Generation) chatTemplateKwargs() map[string]any {
	if g.ChatTemplateKwargs != nil {
		return g.ChatTemplateKwargs
	}
	kw, _ := g.Extra["chat_template_kwargs"].(map[string]any)
	return kw
}

// ReasoningAsked reports whether the job asks the model to think (a
// thinking switch set true and reasoning not disabled), so an answer with
// an empty reasoning_content is a reject.
func (g Generation) ReasoningAsked() bool {
	if g.Reasoning == ReasoningDisable {
		return false
	}
	kw := g.chatTemplateKwargs()
	for _, k := range thinkingKeys {
		if on, ok := kw[k].(bool); ok && on {
			return true
		}
	}
	return false
}
