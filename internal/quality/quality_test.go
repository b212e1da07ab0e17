package quality

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
)

func call(name, args string) llm.ToolCall {
	var c llm.ToolCall
	c.ID, c.Type = "call_1", "function"
	c.Function.Name, c.Function.Arguments = name, args
	return c
}

// prose is n words of varied text that has no repeated 10-word run.
func prose(n int, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 1))
	vocab := strings.Fields(`the a model answer server token lane request store sample drafter turn tool call result
		returns writes reads keeps sends because when while after before every each only never always
		fast slow long short first last next new old good bad clear simple durable exact`)
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.IntN(len(vocab))])
		if rng.IntN(12) == 0 {
			b.WriteString(".\n")
		}
	}
	return b.String()
}

func TestRulesFireAndPass(t *testing.T) {
	tools := []string{"get_weather", "get_time"}
	base := llm.Result{Content: "It is sunny in Paris.", ReasoningContent: "The user asks about weather.", FinishReason: "stop",
		Usage: llm.Usage{CompletionTokens: 12}}
	with := func(f func(r *llm.Result)) llm.Result { r := base; f(&r); return r }
	loop := prose(300, 1) + " " + strings.Repeat("I will now check the weather in Paris for you again. ", 25)
	tests := []struct {
		name     string
		rules    Rules
		req      Request
		res      llm.Result
		wantRule string
		evidence string // a substring of the evidence
	}{
		{"clean answer passes every rule", Default(), Request{Tools: tools, Reasoning: ReasoningRequired}, base, "", ""},
		{"zero rules check nothing", Rules{}, Request{}, with(func(r *llm.Result) { r.Content, r.FinishReason = "", "length" }), "", ""},

		{"truncated fires", Default(), Request{}, with(func(r *llm.Result) { r.FinishReason, r.Usage.CompletionTokens = "length", 16384 }), RuleTruncated, "after 16384 completion tokens"},
		{"truncated off", Rules{Empty: true}, Request{}, with(func(r *llm.Result) { r.FinishReason = "length" }), "", ""},
		{"stop passes truncated", Rules{Truncated: true}, Request{}, base, "", ""},

		{"empty fires", Default(), Request{}, with(func(r *llm.Result) { r.Content = " \n\t" }), RuleEmpty, "empty content and no tool call"},
		{"tool call alone is not empty", Default(), Request{Tools: tools}, with(func(r *llm.Result) {
			r.Content, r.ToolCalls = "", []llm.ToolCall{call("get_weather", `{"city":"Paris"}`)}
		}), "", ""},

		{"reasoning asked and missing", Default(), Request{Reasoning: ReasoningRequired}, with(func(r *llm.Result) { r.ReasoningContent = "" }), RuleReasoning, "reasoning_content is empty"},
		{"reasoning asked and present", Default(), Request{Reasoning: ReasoningRequired}, base, "", ""},
		{"reasoning off and present", Default(), Request{Reasoning: ReasoningForbidden}, base, RuleReasoning, "thinking was turned off"},
		{"reasoning off and absent", Default(), Request{Reasoning: ReasoningForbidden}, with(func(r *llm.Result) { r.ReasoningContent = "" }), "", ""},
		{"reasoning not asked, absent", Default(), Request{}, with(func(r *llm.Result) { r.ReasoningContent = "" }), "", ""},

		{"think tag in content", Default(), Request{}, with(func(r *llm.Result) { r.Content = "<think>hmm</think>It is sunny." }), RuleThinkTags, "content holds <think>"},
		{"closing tag in content", Default(), Request{}, with(func(r *llm.Result) { r.Content = "hmm</think>It is sunny." }), RuleThinkTags, "</think>"},
		{"kimi marker in reasoning", Default(), Request{}, with(func(r *llm.Result) { r.ReasoningContent = "◁think▷ let me see" }), RuleThinkTags, "reasoning_content holds ◁think▷"},
		{"the word think passes", Default(), Request{}, with(func(r *llm.Result) { r.Content = "I think <b>it</b> is sunny." }), "", ""},

		{"tool args not JSON", Default(), Request{Tools: tools}, with(func(r *llm.Result) {
			r.ToolCalls = []llm.ToolCall{call("get_weather", `{"city": "Par`)}
		}), RuleToolArgs, `tool call 0 (get_weather)`},
		{"tool args a JSON array", Default(), Request{Tools: tools}, with(func(r *llm.Result) {
			r.ToolCalls = []llm.ToolCall{call("get_weather", `["Paris"]`)}
		}), RuleToolArgs, "not a JSON object"},
		{"tool args empty object pass", Default(), Request{Tools: tools}, with(func(r *llm.Result) {
			r.ToolCalls = []llm.ToolCall{call("get_time", `{}`)}
		}), "", ""},

		{"tool name undeclared", Default(), Request{Tools: tools}, with(func(r *llm.Result) {
			r.ToolCalls = []llm.ToolCall{call("get_weather", `{}`), call("book_flight", `{}`)}
		}), RuleToolName, `tool call 1 names "book_flight", which is not among the declared tools (get_weather, get_time)`},
		{"tool call with no tools declared", Default(), Request{}, with(func(r *llm.Result) {
			r.ToolCalls = []llm.ToolCall{call("get_weather", `{}`)}
		}), RuleToolName, "declared no tools"},

		{"regex in content", Rules{Patterns: []Pattern{{Name: "refusal", Re: regexp.MustCompile(`(?i)as an ai language model`)}}}, Request{},
			with(func(r *llm.Result) { r.Content = "As an AI language model, I cannot." }), RuleRegex, `pattern refusal`},
		{"regex on reasoning only", Rules{Patterns: []Pattern{{Name: "r", Re: regexp.MustCompile(`sunny`), Field: FieldReasoning}}}, Request{}, base, "", ""},
		{"regex on any field", Rules{Patterns: []Pattern{{Name: "r", Re: regexp.MustCompile(`weather\.`), Field: FieldAny}}}, Request{}, base, RuleRegex, "reasoning_content"},

		{"repetition in content", Default(), Request{}, with(func(r *llm.Result) { r.Content = loop }), RuleRepetition, "content repeats the 10-word run"},
		{"repetition in reasoning", Default(), Request{}, with(func(r *llm.Result) { r.ReasoningContent = loop }), RuleRepetition, "reasoning_content repeats"},
		{"repetition under the threshold", Default(), Request{}, with(func(r *llm.Result) {
			r.Content = prose(300, 2) + strings.Repeat(" I will now check the weather in Paris for you again.", 15)
		}), "", ""},
		{"long varied text passes", Default(), Request{}, with(func(r *llm.Result) { r.Content = prose(12000, 3) }), "", ""},
		{"repetition off", Rules{Empty: true}, Request{}, with(func(r *llm.Result) { r.Content = loop }), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.rules.Check(tt.req, tt.res)
			if v.Rule != tt.wantRule {
				t.Fatalf("Check = %q (%s), want rule %q", v.Rule, v.Evidence, tt.wantRule)
			}
			if v.Rejected() != (tt.wantRule != "") {
				t.Errorf("Rejected() = %v with rule %q", v.Rejected(), v.Rule)
			}
			if !strings.Contains(v.Evidence, tt.evidence) {
				t.Errorf("evidence %q does not contain %q", v.Evidence, tt.evidence)
			}
		})
	}
}

func TestFindRepetition(t *testing.T) {
	tests := []struct {
		name       string
		text       string
		n, max     int
		want       bool
		wantText   string
		wantOffset int
	}{
		{"loop found with its first occurrence", "intro words here. " + strings.Repeat("a b c d ", 10), 4, 5, true, "a b c d", 18},
		{"same word over and over", strings.Repeat("ha ", 40), 10, 20, true, strings.TrimSpace(strings.Repeat("ha ", 10)), 0},
		{"exactly the threshold is allowed", strings.Repeat("a b c ", 5) + "z", 3, 5, false, "", 0},
		{"one more is a loop", strings.Repeat("a b c ", 6), 3, 5, true, "a b c", 0},
		{"whitespace kinds do not matter", "x\ty\nx y  x\u3000y", 2, 2, true, "x\ty", 0},
		{"CJK characters are words", strings.Repeat("我们再试一次。", 8), 7, 5, true, "我们再试一次。", 0},
		{"short text", "a a", 10, 1, false, "", 0},
		{"empty", "", 10, 1, false, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, ok := FindRepetition(tt.text, tt.n, tt.max)
			if ok != tt.want {
				t.Fatalf("found = %v (%+v), want %v", ok, rep, tt.want)
			}
			if !ok {
				return
			}
			if rep.Text != tt.wantText || rep.Offset != tt.wantOffset || rep.Count != tt.max+1 {
				t.Errorf("repeat = %+v, want text %q at %d counted %d", rep, tt.wantText, tt.wantOffset, tt.max+1)
			}
		})
	}
}

// TestFindRepetitionAgreesWithNaiveCount checks the rolling hash against a
// plain count of word n-grams on random texts from a tiny vocabulary, where
// repeats are common.
func TestFindRepetitionAgreesWithNaiveCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	words := []string{"x", "y", "z", "w"}
	for trial := range 300 {
		n := 1 + rng.IntN(4)
		maxRep := 1 + rng.IntN(6)
		var ws []string
		for range 5 + rng.IntN(60) {
			ws = append(ws, words[rng.IntN(len(words))])
		}
		text := strings.Join(ws, " ")
		want := false
		counts := map[string]int{}
		for i := 0; i+n <= len(ws); i++ {
			k := strings.Join(ws[i:i+n], " ")
			counts[k]++
			if counts[k] > maxRep {
				want = true
				break
			}
		}
		if _, got := FindRepetition(text, n, maxRep); got != want {
			t.Fatalf("trial %d: FindRepetition(%q, %d, %d) = %v, naive count says %v", trial, text, n, maxRep, got, want)
		}
	}
}

// sixteenK is a 16,384-token answer (about 4 bytes per token): varied prose,
// or the same length ending in a loop, as a stuck model writes it.
func sixteenK(loop bool) string {
	s := prose(13000, 9)
	if loop {
		s = s[:len(s)/2] + strings.Repeat(" Let me verify the previous step once more before answering.", 600)
	}
	return s[:min(len(s), 16384*4)]
}

func BenchmarkFindRepetition16K(b *testing.B) {
	for _, tc := range []struct {
		name string
		loop bool
	}{{"clean", false}, {"loop", true}} {
		text := sixteenK(tc.loop)
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				_, found := FindRepetition(text, DefaultNGram, DefaultMaxRepeats)
				if found != tc.loop {
					b.Fatalf("found = %v, want %v", found, tc.loop)
				}
			}
		})
	}
}

func BenchmarkCheckDefault16K(b *testing.B) {
	res := llm.Result{Content: sixteenK(false), ReasoningContent: prose(2000, 4), FinishReason: "stop"}
	r := Default()
	b.SetBytes(int64(len(res.Content) + len(res.ReasoningContent)))
	b.ReportAllocs()
	for b.Loop() {
		if v := r.Check(Request{}, res); v.Rejected() {
			b.Fatal(v)
		}
	}
}

func ExampleRules_Check() {
	r := Default()
	v := r.Check(Request{}, llm.Result{Content: "<think>plan</think>Done.", FinishReason: "stop"})
	fmt.Println(v.Rule)
	// Output: think_tags
}
