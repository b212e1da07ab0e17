package quality

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/regen-dev/regen/internal/llm"
)

// Rule names, as stored with a rejected sample and given to
// `regen requeue --rejected --rule`.
const (
	RuleTruncated  = "truncated"
	RuleEmpty      = "empty"
	RuleReasoning  = "reasoning"
	RuleThinkTags  = "think_tags"
	RuleToolArgs   = "tool_args"
	RuleToolName   = "tool_name"
	RuleRegex      = "regex"
	RuleRepetition = "repetition"
)

// RuleNames lists every rule, in the order Check applies them.
var RuleNames = []string{RuleTruncated, RuleEmpty, RuleReasoning, RuleThinkTags, RuleToolArgs, RuleToolName, RuleRegex, RuleRepetition}

// Reasoning is what the request said about thinking.
type Reasoning int

const (
	// ReasoningAny: the request neither asked for thinking nor turned it off.
	ReasoningAny Reasoning = iota
	// ReasoningRequired: thinking was asked for; an empty reasoning_content is a reject.
	ReasoningRequired
	// ReasoningForbidden: thinking was turned off; a reasoning_content is a reject.
	ReasoningForbidden
)

// Request is what Check needs to know about the request that was sent.
type Request struct {
	// Tools are the names of the tools the request declared; a tool call
	// naming any other tool is rejected by tool_name.
	Tools     []string
	Reasoning Reasoning
}

// Field selects which text a Pattern is matched against.
type Field string

const (
	FieldContent   Field = "content"
	FieldReasoning Field = "reasoning"
	FieldAny       Field = "any"
)

// Pattern is a user rule: an answer whose Field matches Re is rejected.
type Pattern struct {
	Name  string
	Re    *regexp.Regexp
	Field Field // "" = FieldContent
}

// Repetition configures the degenerate-loop rule; MaxRepeats 0 turns it off.
type Repetition struct {
	NGram      int // words per n-gram; 0 = DefaultNGram
	MaxRepeats int // an n-gram occurring more often than this is a loop
}

// Defaults of the repetition rule: a run of 10 words occurring more than 20
// times. Legitimate answers (code, tables, lists) repeat short phrases, not
// ten-word runs twenty times; a model stuck in a loop repeats one hundreds
// of times until max_tokens.
const (
	DefaultNGram      = 10
	DefaultMaxRepeats = 20
)

// Rules is the set of rules Check applies. The zero value checks nothing.
type Rules struct {
	Truncated  bool
	Empty      bool
	Reasoning  bool
	ThinkTags  bool
	ToolArgs   bool
	ToolName   bool
	Patterns   []Pattern
	Repetition Repetition
}

// Default returns every rule on with its default settings and no patterns.
func Default() Rules {
	return Rules{Truncated: true, Empty: true, Reasoning: true, ThinkTags: true, ToolArgs: true, ToolName: true,
		Repetition: Repetition{NGram: DefaultNGram, MaxRepeats: DefaultMaxRepeats}}
}

// Verdict is Check's answer: Rule is "" when the answer is accepted.
type Verdict struct {
	Rule     string
	Evidence string
}

// Rejected reports whether a rule rejected the answer.
func (v Verdict) Rejected() bool { return v.Rule != "" }

func reject(rule, format string, args ...any) Verdict {
	return Verdict{Rule: rule, Evidence: fmt.Sprintf(format, args...)}
}

// Check applies the rules to res, answered to req, and returns the first
// rule that rejects it.
func (r *Rules) Check(req Request, res llm.Result) Verdict {
	if r.Truncated && res.FinishReason == "length" {
		return reject(RuleTruncated, "finish_reason length after %d completion tokens, with no bigger lane left", res.Usage.CompletionTokens)
	}
	if r.Empty && strings.TrimSpace(res.Content) == "" && len(res.ToolCalls) == 0 {
		return reject(RuleEmpty, "empty content and no tool call (finish_reason %s, %d completion tokens)", res.FinishReason, res.Usage.CompletionTokens)
	}
	if r.Reasoning {
		if v := checkReasoning(req.Reasoning, res); v.Rejected() {
			return v
		}
	}
	if r.ThinkTags {
		if v := checkThinkTags(res); v.Rejected() {
			return v
		}
	}
	if r.ToolArgs {
		if v := checkToolArgs(res.ToolCalls); v.Rejected() {
			return v
		}
	}
	if r.ToolName {
		if v := checkToolNames(req.Tools, res.ToolCalls); v.Rejected() {
			return v
		}
	}
	for _, p := range r.Patterns {
		if v := p.check(res); v.Rejected() {
			return v
		}
	}
	if r.Repetition.MaxRepeats > 0 {
		for _, f := range []struct{ name, text string }{{"content", res.Content}, {"reasoning_content", res.ReasoningContent}} {
			if rep, ok := FindRepetition(f.text, r.Repetition.NGram, r.Repetition.MaxRepeats); ok {
				return reject(RuleRepetition, "%s repeats the %d-word run %q more than %d times (at byte %d)",
					f.name, rep.Words, clip(rep.Text, 120), r.Repetition.MaxRepeats, rep.Offset)
			}
		}
	}
	return Verdict{}
}

func checkReasoning(want Reasoning, res llm.Result) Verdict {
	switch {
	case want == ReasoningRequired && strings.TrimSpace(res.ReasoningContent) == "":
		return reject(RuleReasoning, "thinking was asked for but reasoning_content is empty (%d completion tokens)", res.Usage.CompletionTokens)
	case want == ReasoningForbidden && strings.TrimSpace(res.ReasoningContent) != "":
		return reject(RuleReasoning, "thinking was turned off but reasoning_content has %d bytes: %q", len(res.ReasoningContent), clip(res.ReasoningContent, 80))
	}
	return Verdict{}
}

// thinkMarkers are the reasoning delimiters of Qwen3/DeepSeek (<think>) and
// Kimi K2 (◁think▷). Found in content, the reasoning parser did not split
// the answer; found in reasoning_content, it split it badly.
var thinkMarkers = []string{"<think>", "</think>", "◁think▷", "◁/think▷"}

func checkThinkTags(res llm.Result) Verdict {
	for _, f := range []struct{ name, text string }{{"content", res.Content}, {"reasoning_content", res.ReasoningContent}} {
		for _, m := range thinkMarkers {
			if i := strings.Index(f.text, m); i >= 0 {
				return reject(RuleThinkTags, "%s holds %s at byte %d: %q", f.name, m, i, around(f.text, i, 60))
			}
		}
	}
	return Verdict{}
}

func checkToolArgs(calls []llm.ToolCall) Verdict {
	for i, c := range calls {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(c.Function.Arguments), &obj); err != nil || obj == nil {
			why := "not a JSON object"
			if err != nil {
				why = err.Error()
			}
			return reject(RuleToolArgs, "tool call %d (%s): arguments are not a JSON object (%s): %q", i, c.Function.Name, why, clip(c.Function.Arguments, 120))
		}
	}
	return Verdict{}
}

func checkToolNames(declared []string, calls []llm.ToolCall) Verdict {
	for i, c := range calls {
		if slices.Contains(declared, c.Function.Name) {
			continue
		}
		if len(declared) == 0 {
			return reject(RuleToolName, "tool call %d names %q but the request declared no tools", i, c.Function.Name)
		}
		return reject(RuleToolName, "tool call %d names %q, which is not among the declared tools (%s)", i, c.Function.Name, strings.Join(declared, ", "))
	}
	return Verdict{}
}

func (p Pattern) check(res llm.Result) Verdict {
	fields := []struct{ name, text string }{{"content", res.Content}}
	switch p.Field {
	case FieldReasoning:
		fields = []struct{ name, text string }{{"reasoning_content", res.ReasoningContent}}
	case FieldAny:
		fields = append(fields, struct{ name, text string }{"reasoning_content", res.ReasoningContent})
	}
	for _, f := range fields {
		if loc := p.Re.FindStringIndex(f.text); loc != nil {
			return reject(RuleRegex, "pattern %s (%s) matched %s at byte %d: %q", p.Name, p.Re, f.name, loc[0], clip(f.text[loc[0]:loc[1]], 80))
		}
	}
	return Verdict{}
}

// clip shortens s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !runeStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// around returns up to n bytes of s on each side of byte i.
func around(s string, i, n int) string {
	lo, hi := max(i-n, 0), min(i+n, len(s))
	for lo > 0 && !runeStart(s[lo]) {
		lo--
	}
	for hi < len(s) && !runeStart(s[hi]) {
		hi++
	}
	return s[lo:hi]
}

func runeStart(b byte) bool { return b&0xC0 != 0x80 }
