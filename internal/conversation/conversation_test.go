package conversation

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/rawjson"
)

func tc(id, name, args string) llm.ToolCall {
	var c llm.ToolCall
	c.ID, c.Type = id, "function"
	c.Function.Name, c.Function.Arguments = name, args
	return c
}

// simple renders messages as role:content lines (tool calls and ids
// appended), to compare histories at a glance.
func simple(t *testing.T, body []byte) []string {
	t.Helper()
	var req struct {
		Messages []Message `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("request body %s: %v", body, err)
	}
	var out []string
	for _, m := range req.Messages {
		s := m.Role + ":" + string(m.Content)
		if m.ReasoningContent != "" {
			s += " reasoning=" + m.ReasoningContent
		}
		if len(m.ToolCalls) > 0 {
			var calls []llm.ToolCall
			json.Unmarshal(m.ToolCalls, &calls)
			for _, c := range calls {
				s += " call=" + c.ID + "/" + c.Function.Name + c.Function.Arguments
			}
		}
		if m.ToolCallID != "" {
			s += " for=" + m.ToolCallID
		}
		out = append(out, s)
	}
	return out
}

const glaiveBody = `{"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Book a room"}],` +
	`"tools":[{"type":"function","function":{"name":"book","parameters":{}}},{"type":"function","function":{"name":"cancel"}}],` +
	`"turns":[{"calls":[{"id":"call_1","type":"function","function":{"name":"book","arguments":"{\"room\": \"A\", \"n\": 2}"}}],` +
	`"input":[{"role":"tool","content":"{\"ok\":true}","tool_call_id":"call_1"}]},` +
	`{"input":[{"role":"user","content":"Thanks! And cancel B?"}]}]}`

func TestLegacyBodyIsSentAsIs(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"a <b> & c"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)
	p, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	if p.NumTurns() != 1 {
		t.Fatalf("NumTurns = %d, want 1", p.NumTurns())
	}
	got, err := p.Request(0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(body) {
		t.Errorf("Request(0) = %s, want the body unchanged", got)
	}
	if diff := cmp.Diff([]string{"f"}, p.ToolNames()); diff != "" {
		t.Errorf("ToolNames (-want +got):\n%s", diff)
	}
	if ok, why := p.Continue(0, llm.Result{Content: "x"}); ok || why != "" {
		t.Errorf("Continue after the only turn = %v %q, want false with no reason", ok, why)
	}
}

func TestMultiTurnRequestsUseTheModelsAnswers(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"q0"}],"turns":[{"input":[{"role":"user","content":"q1"}]},{"input":[{"role":"user","content":"q2"}]}]}`
	p, err := Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	answers := []llm.Result{
		{Content: "a0", ReasoningContent: "r0"},
		{Content: "a1", ReasoningContent: "r1"},
		{Content: "a2", ReasoningContent: "r2"},
	}
	want := map[bool][][]string{
		false: {
			{`user:"q0"`},
			{`user:"q0"`, `assistant:"a0"`, `user:"q1"`},
			{`user:"q0"`, `assistant:"a0"`, `user:"q1"`, `assistant:"a1"`, `user:"q2"`},
		},
		true: {
			{`user:"q0"`},
			{`user:"q0"`, `assistant:"a0" reasoning=r0`, `user:"q1"`},
			{`user:"q0"`, `assistant:"a0" reasoning=r0`, `user:"q1"`, `assistant:"a1" reasoning=r1`, `user:"q2"`},
		},
	}
	for _, keep := range []bool{false, true} {
		for k := range 3 {
			req, err := p.Request(k, answers[:k], keep)
			if err != nil {
				t.Fatalf("Request(%d): %v", k, err)
			}
			if diff := cmp.Diff(want[keep][k], simple(t, req)); diff != "" {
				t.Errorf("keepReasoning=%v turn %d history (-want +got):\n%s", keep, k, diff)
			}
		}
	}
	if _, err := p.Request(2, answers[:1], false); err == nil {
		t.Error("Request(2) with one earlier answer: no error")
	}
	if _, err := p.Request(3, answers, false); err == nil {
		t.Error("Request(3) of a 3-turn plan: no error")
	}
	conv, err := p.Conversation(answers)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(request{Messages: conv})
	wantConv := []string{`user:"q0"`, `assistant:"a0" reasoning=r0`, `user:"q1"`, `assistant:"a1" reasoning=r1`, `user:"q2"`, `assistant:"a2" reasoning=r2`}
	if diff := cmp.Diff(wantConv, simple(t, b)); diff != "" {
		t.Errorf("Conversation (-want +got):\n%s", diff)
	}
}

func TestToolRoundTrip(t *testing.T) {
	p, err := Decode([]byte(glaiveBody))
	if err != nil {
		t.Fatal(err)
	}
	if p.NumTurns() != 3 {
		t.Fatalf("NumTurns = %d, want 3", p.NumTurns())
	}
	// Same call with keys reordered and spacing changed: a match.
	call := llm.Result{Content: "", ToolCalls: []llm.ToolCall{tc("chatcmpl-tool-9", "book", `{"n":2,"room":"A"}`)}, FinishReason: "tool_calls"}
	if ok, why := p.Continue(0, call); !ok {
		t.Fatalf("Continue after a matching call = false: %s", why)
	}
	req, err := p.Request(1, []llm.Result{call}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`system:"You are helpful."`, `user:"Book a room"`,
		`assistant:null call=chatcmpl-tool-9/book{"n":2,"room":"A"}`,
		`tool:"{\"ok\":true}" for=chatcmpl-tool-9`,
	}
	if diff := cmp.Diff(want, simple(t, req)); diff != "" {
		t.Errorf("turn 1 history (-want +got):\n%s", diff)
	}
	if !strings.Contains(string(req), `"tools":[{"type":"function","function":{"name":"book"`) {
		t.Errorf("turn 1 request lacks the tools: %s", req)
	}
	// A call without an id gets one, and the tool result follows it.
	noID := llm.Result{ToolCalls: []llm.ToolCall{tc("", "book", `{"room":"A","n":2}`)}}
	req, err = p.Request(1, []llm.Result{noID}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := simple(t, req); got[2] != `assistant:null call=call_0_0/book{"room":"A","n":2}` || got[3] != `tool:"{\"ok\":true}" for=call_0_0` {
		t.Errorf("history with a generated id: %q", got[2:])
	}
	// The text answer to the tool result is followed by the user message.
	answer := llm.Result{Content: "Booked."}
	if ok, why := p.Continue(1, answer); !ok {
		t.Fatalf("Continue after a text answer before a user turn = false: %s", why)
	}
	if _, err := p.Request(2, []llm.Result{call, answer}, false); err != nil {
		t.Fatal(err)
	}
}

func TestContinueEndsTheConversation(t *testing.T) {
	p, err := Decode([]byte(glaiveBody))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		turn int
		res  llm.Result
		why  string
	}{
		{"text where the dataset called", 0, llm.Result{Content: "Which day?"}, "turn 1 answered without a tool call where the dataset called book"},
		{"other function", 0, llm.Result{ToolCalls: []llm.ToolCall{tc("c", "cancel", `{"room":"A","n":2}`)}}, "call 0 is cancel, the dataset's is book"},
		{"other arguments", 0, llm.Result{ToolCalls: []llm.ToolCall{tc("c", "book", `{"room":"A","n":3}`)}}, `call 0 (book): arguments {"room":"A","n":3}, the dataset's {"room": "A", "n": 2}`},
		{"two calls", 0, llm.Result{ToolCalls: []llm.ToolCall{tc("c", "book", `{"room":"A","n":2}`), tc("d", "book", `{}`)}}, "the model made 2 calls (book, book), the dataset 1 (book)"},
		{"bad arguments", 0, llm.Result{ToolCalls: []llm.ToolCall{tc("c", "book", `{"room":`)}}, "the model's arguments are not JSON"},
		{"call before a user turn", 1, llm.Result{ToolCalls: []llm.ToolCall{tc("c", "cancel", `{}`)}}, "turn 2 called cancel, but the dataset answered without a tool call and goes on with a user message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, why := p.Continue(tt.turn, tt.res)
			if ok || !strings.Contains(why, tt.why) {
				t.Errorf("Continue = %v %q, want false with %q", ok, why, tt.why)
			}
		})
	}
}

func TestMatchCallsDoubleEncodedArguments(t *testing.T) {
	rec := []llm.ToolCall{tc("call_1", "f", `"{\"a\": [1, 2]}"`)}
	if ok, why := MatchCalls(rec, []llm.ToolCall{tc("x", "f", `{"a":[1,2]}`)}); !ok {
		t.Errorf("string-encoded arguments do not match their object: %s", why)
	}
	if ok, _ := MatchCalls(rec, []llm.ToolCall{tc("x", "f", `{"a":[2,1]}`)}); ok {
		t.Error("arguments in another order matched")
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, body := range []string{`{`, `{"messages":[]}`, `{"messages":[{"role":"user","content":"x"}],"turns":[{"input":[]}]}`} {
		if _, err := Decode([]byte(body)); err == nil {
			t.Errorf("Decode(%s): no error", body)
		}
	}
}

// An answer read from the store as quoted content (ContentJSON, Content
// empty) is the message its decoded text gives: the same content bytes,
// and null beside tool calls when the text is empty.
func TestAnswerFromQuotedContent(t *testing.T) {
	call := llm.ToolCall{ID: "c1", Type: "function"}
	call.Function.Name, call.Function.Arguments = "f", `{}`
	for _, res := range []llm.Result{
		{Content: "plain"},
		{Content: "line\n \"q\" <b> & \u2028 é"},
		{Content: ""},
		{Content: "", ToolCalls: []llm.ToolCall{call}},
		{Content: "and a call", ToolCalls: []llm.ToolCall{call}},
	} {
		want := Answer(1, res, false)
		quoted := res
		quoted.Content, quoted.ContentJSON = "", rawjson.AppendString(nil, res.Content)
		if diff := cmp.Diff(want, Answer(1, quoted, false)); diff != "" {
			t.Errorf("Answer of %q quoted (-decoded +quoted):\n%s", res.Content, diff)
		}
	}
}
