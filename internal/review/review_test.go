package review

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

const threeTurns = `{"messages":[{"role":"user","content":"a"}],` +
	`"tools":[{"type":"function","function":{"name":"f"}}],` +
	`"turns":[{"calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}],"input":[{"role":"tool","content":"42","tool_call_id":"c1"}]},` +
	`{"input":[{"role":"user","content":"c"}]}],` +
	`"original":[[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}],` +
	`[{"role":"assistant","content":"It is 42."}],[{"role":"assistant","content":"C"}]]}`

func stored(t *testing.T, turn int, r llm.Result, lane string, attempts int) store.Result {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return store.Result{Response: b, FinishReason: r.FinishReason, PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens,
		Endpoint: "http://127.0.0.1:1", Duration: 1500 * time.Millisecond, TTFT: 20 * time.Millisecond, Turn: turn, Lane: lane, Attempts: attempts}
}

// TestOf puts rows of every fate together: each turn's input, the
// dataset's answer beside the model's, how each answer was made, and why
// the conversation ended early, was rejected or died.
func TestOf(t *testing.T) {
	call := llm.ToolCall{ID: "call_9", Type: "function"}
	call.Function.Name, call.Function.Arguments = "f", `{}`
	a0 := llm.Result{ToolCalls: []llm.ToolCall{call}, ReasoningContent: "need f", FinishReason: "tool_calls", Usage: llm.Usage{PromptTokens: 10, CompletionTokens: 5, ReasoningTokens: 2}}
	a1 := llm.Result{Content: "The answer is 42, and more.", FinishReason: "stop", Usage: llm.Usage{PromptTokens: 30, CompletionTokens: 7}}
	ended := store.Row{ID: "P/x", Partition: "P", Lane: "long", State: store.Done, Attempts: 2, Body: []byte(threeTurns), Origin: "d.jsonl:3",
		Prior: []store.Result{stored(t, 0, a0, "short", 1)}, Result: stored(t, 1, a1, "long", 2)}
	ended.Result.EndReason = "turn 2: the dataset's next turn is a user message after an answer that called no tool"
	rejected := ended
	rejected.State, rejected.Rule, rejected.Reason = store.Rejected, "repetition", `"and more" repeated 30 times`
	rejected.Result.EndReason = ""
	dead := store.Row{ID: "P/d", Partition: "P", Lane: "short", State: store.Dead, Attempts: 1, Body: []byte(`{"messages":[{"role":"user","content":"q"}]}`),
		Reason: "bad-request (HTTP 400): context too long"}
	pending := store.Row{ID: "P/p", Partition: "P", Lane: "short", State: store.Pending, Body: []byte(threeTurns), Prior: []store.Result{stored(t, 0, a0, "short", 1)}}

	answer0 := &Answer{Reasoning: "need f", ToolCalls: []llm.ToolCall{call}, Lane: "short", Attempts: 1, FinishReason: "tool_calls",
		Usage: a0.Usage, Endpoint: "http://127.0.0.1:1", DurationMS: 1500, TTFTMS: 20}
	answer1 := &Answer{Content: a1.Content, Lane: "long", Attempts: 2, FinishReason: "stop", Usage: a1.Usage, Endpoint: "http://127.0.0.1:1", DurationMS: 1500, TTFTMS: 20}
	tests := []struct {
		name  string
		row   store.Row
		check func(t *testing.T, s Sample)
	}{
		{"ended early", ended, func(t *testing.T, s Sample) {
			if s.Planned != 3 || len(s.Turns) != 3 || !s.OriginalsKept {
				t.Fatalf("planned %d, %d turns, originals kept %v; want 3, 3, true", s.Planned, len(s.Turns), s.OriginalsKept)
			}
			if diff := cmp.Diff([]*Answer{answer0, answer1, nil}, []*Answer{s.Turns[0].Answer, s.Turns[1].Answer, s.Turns[2].Answer}); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
			if got := text(s.Turns[1].Original[0].Content); got != "It is 42." {
				t.Errorf("turn 1's original = %q", got)
			}
			if got := s.Turns[1].Input[0]; got.Role != "tool" || text(got.Content) != "42" {
				t.Errorf("turn 1's input = %+v, want the tool result", got)
			}
			if s.EndedEarly != ended.Result.EndReason || s.Rule != "" {
				t.Errorf("ended early %q, rule %q", s.EndedEarly, s.Rule)
			}
		}},
		{"rejected", rejected, func(t *testing.T, s Sample) {
			if s.Rule != "repetition" || s.Evidence != rejected.Reason || s.EndedEarly != "" || !s.Turns[1].Answer.Rejected || s.Turns[0].Answer.Rejected {
				t.Errorf("rule %q evidence %q ended %q, rejected marks %v %v", s.Rule, s.Evidence, s.EndedEarly, s.Turns[0].Answer.Rejected, s.Turns[1].Answer.Rejected)
			}
		}},
		{"dead", dead, func(t *testing.T, s Sample) {
			if s.Error != dead.Reason || len(s.Turns) != 1 || s.Turns[0].Answer != nil || s.OriginalsKept {
				t.Errorf("error %q, turns %+v, originals kept %v", s.Error, s.Turns, s.OriginalsKept)
			}
		}},
		{"in progress", pending, func(t *testing.T, s Sample) {
			if s.Turns[0].Answer == nil || s.Turns[1].Answer != nil || s.State != "pending" {
				t.Errorf("state %s, answers %v %v: want turn 0 answered only", s.State, s.Turns[0].Answer, s.Turns[1].Answer)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Of(tt.row)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s)
		})
	}
	if _, err := Of(store.Row{ID: "P/bad", Body: []byte(`{"messages":[{"role":"user","content":"q"}]}`), Result: store.Result{Response: []byte("{")}}); err == nil || !strings.Contains(err.Error(), "P/bad") {
		t.Errorf("a broken stored answer: err %v, want one naming the sample", err)
	}
}

// TestWrite prints a sample for the terminal: every turn with both
// answers, the fate, and no raw escape sequence from the data.
func TestWrite(t *testing.T) {
	a1 := llm.Result{Content: "red \x1b[31malert\x1b[0m", FinishReason: "stop", Usage: llm.Usage{PromptTokens: 3, CompletionTokens: 4}}
	row := store.Row{ID: "P/x", Partition: "P", Lane: "short", State: store.Done, Attempts: 1, Body: []byte(threeTurns),
		Result: stored(t, 0, a1, "short", 1)}
	row.Result.EndReason = "turn 1: the model called no tool where the dataset recorded f"
	s, err := Of(row)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := Write(&b, s); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"sample P/x", "turns: 1 answered of 3 planned", "ended early: turn 1: the model called no tool where the dataset recorded f",
		"── turn 1 of 3 ──", "  [user] a", "original (dataset):", "  [assistant] tool call: f({}) c1",
		"regenerated (lane short, attempts 1, finish stop, 3 prompt + 4 completion tokens", `red \x1b[31malert\x1b[0m`,
		"── turn 2 of 3 ──", "  [tool c1] 42", "  [assistant] It is 42.", "regenerated: (not reached)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsRune(out, 0x1b) {
		t.Errorf("output carries a raw escape character:\n%q", out)
	}
}
