package export

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// turnRow is a done row of a multi-turn body whose answers are given in
// order; the last one is the row's result.
func turnRow(t *testing.T, id, body string, endReason string, answers ...llm.Result) store.Row {
	t.Helper()
	last := len(answers) - 1
	row := doneRow(t, id, body, answers[last])
	row.Result.Turn, row.Result.EndReason = last, endReason
	for i, a := range answers[:last] {
		row.Prior = append(row.Prior, store.Result{Response: result(t, a), FinishReason: a.FinishReason, Turn: i,
			PromptTokens: a.Usage.PromptTokens, CompletionTokens: a.Usage.CompletionTokens,
			Lane: "short", Attempts: 1, Endpoint: "http://127.0.0.1:30001"})
	}
	return row
}

func call(id, name, args string) llm.ToolCall {
	var c llm.ToolCall
	c.ID, c.Type = id, "function"
	c.Function.Name, c.Function.Arguments = name, args
	return c
}

// contractRows are the shapes the contract must hold for: several
// regenerated turns with reasoning, a tool round trip, a conversation that
// ended early, a single turn.
func contractRows(t *testing.T) []store.Row {
	chat := `{"messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"What is <b>?"}],` +
		`"turns":[{"input":[{"role":"user","content":"And & ?"}]},{"input":[{"role":"user","content":"Thanks."}]}]}`
	tools := `{"messages":[{"role":"user","content":"Book room A"}],"tools":[{"type":"function","function":{"name":"book","parameters":{"type":"object"}}}],` +
		`"turns":[{"calls":[{"id":"call_1","type":"function","function":{"name":"book","arguments":"{\"room\":\"A\"}"}}],` +
		`"input":[{"role":"tool","content":"{\"ok\":true}","tool_call_id":"call_1"}]},{"input":[{"role":"user","content":"And B?"}]}]}`
	u := llm.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}
	return []store.Row{
		turnRow(t, "multi", chat, "",
			llm.Result{Content: "A <b> tag.", ReasoningContent: "HTML.", FinishReason: "stop", Usage: u},
			llm.Result{Content: "An ampersand.", ReasoningContent: "Entities.", FinishReason: "stop", Usage: u},
			llm.Result{Content: "You're welcome.", ReasoningContent: "Polite.", FinishReason: "stop", Usage: u}),
		turnRow(t, "tools", tools, "",
			llm.Result{ToolCalls: []llm.ToolCall{call("srv-1", "book", `{"room": "A"}`)}, FinishReason: "tool_calls", Usage: u},
			llm.Result{Content: "Room A is booked.", FinishReason: "stop", Usage: u},
			llm.Result{ToolCalls: []llm.ToolCall{call("srv-2", "book", `{"room":"B"}`)}, FinishReason: "tool_calls", Usage: u}),
		turnRow(t, "ended", tools, "turn 1 answered without a tool call where the dataset called book",
			llm.Result{Content: "Which day?", FinishReason: "stop", Usage: u}),
		doneRow(t, "single", `{"messages":[{"role":"user","content":"hi"}]}`, llm.Result{Content: "hello", FinishReason: "stop", Usage: u}),
	}
}

func exportLines(t *testing.T, rows []store.Row, o Options) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	if _, err := ExportWith(context.Background(), &fakeStore{rows: rows}, dir, []string{FormatShareGPT}, "c", o); err != nil {
		t.Fatalf("Export: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "c.sharegpt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var rec struct{ ID string }
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("line %s: %v", line, err)
		}
		out[rec.ID] = line
	}
	return out
}

func TestShareGPTContract(t *testing.T) {
	for _, meta := range []string{MetadataMinimal, MetadataFull} {
		lines := exportLines(t, contractRows(t), Options{Metadata: meta})
		if len(lines) != 4 {
			t.Fatalf("%s: %d lines, want 4", meta, len(lines))
		}
		for id, line := range lines {
			if err := CheckShareGPTLine(line); err != nil {
				t.Errorf("%s %s breaks the contract: %v\n%s", meta, id, err, line)
			}
			var keys map[string]json.RawMessage
			json.Unmarshal(line, &keys)
			_, endpoint := keys["endpoint"]
			_, attempts := keys["attempts"]
			if (meta == MetadataFull) != (endpoint && attempts) {
				t.Errorf("%s %s: endpoint %v, attempts %v in the record", meta, id, endpoint, attempts)
			}
		}
	}
}

func TestShareGPTConversations(t *testing.T) {
	lines := exportLines(t, contractRows(t), Options{})
	type msg struct {
		Role             string          `json:"role"`
		Content          string          `json:"content"`
		ReasoningContent string          `json:"reasoning_content"`
		ToolCallID       string          `json:"tool_call_id"`
		ToolCalls        []llm.ToolCall  `json:"tool_calls"`
		Extra            json.RawMessage `json:"-"`
	}
	conv := func(id string) []msg {
		var rec struct{ Conversations []msg }
		if err := json.Unmarshal(lines[id], &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Conversations
	}
	want := []msg{
		{Role: "system", Content: "Be kind."}, {Role: "user", Content: "What is <b>?"},
		{Role: "assistant", Content: "A <b> tag.", ReasoningContent: "HTML."}, {Role: "user", Content: "And & ?"},
		{Role: "assistant", Content: "An ampersand.", ReasoningContent: "Entities."}, {Role: "user", Content: "Thanks."},
		{Role: "assistant", Content: "You're welcome.", ReasoningContent: "Polite."},
	}
	if diff := cmp.Diff(want, conv("multi")); diff != "" {
		t.Errorf("multi-turn conversation (-want +got):\n%s", diff)
	}
	if !strings.Contains(string(lines["multi"]), `"content":"A <b> tag."`) {
		t.Errorf("HTML characters escaped in %s", lines["multi"])
	}
	tools := conv("tools")
	var roles []string
	for _, m := range tools {
		roles = append(roles, m.Role)
	}
	if diff := cmp.Diff([]string{"user", "assistant", "tool", "assistant", "user", "assistant"}, roles); diff != "" {
		t.Errorf("tool conversation roles (-want +got):\n%s", diff)
	}
	if tools[2].ToolCallID != "srv-1" || tools[1].ToolCalls[0].ID != "srv-1" || tools[1].Content != "" {
		t.Errorf("tool round trip: call %+v, result for %q; want the model's call srv-1 answered and empty content", tools[1], tools[2].ToolCallID)
	}
	if ended := conv("ended"); len(ended) != 2 || ended[1].Content != "Which day?" {
		t.Errorf("ended conversation = %+v, want the question and the one answer", ended)
	}
	var full struct {
		EndReason string        `json:"end_reason"`
		Turns     []turnDetails `json:"turns"`
	}
	fl := exportLines(t, contractRows(t), Options{Metadata: MetadataFull})
	if err := json.Unmarshal(fl["tools"], &full); err != nil {
		t.Fatal(err)
	}
	if len(full.Turns) != 3 || full.Turns[0].Endpoint != "http://127.0.0.1:30001" || full.Turns[2].Turn != 2 {
		t.Errorf("full metadata turns = %+v", full.Turns)
	}
	json.Unmarshal(fl["ended"], &full)
	if !strings.Contains(full.EndReason, "answered without a tool call") {
		t.Errorf("full metadata end_reason = %q", full.EndReason)
	}
}

// TestContractCheckRefuses shows the checker fails lines that break the contract.
func TestContractCheckRefuses(t *testing.T) {
	ok := `{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`
	if err := CheckShareGPTLine([]byte(ok)); err != nil {
		t.Fatalf("a valid line refused: %v", err)
	}
	bad := map[string]string{
		`{"conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`:                                "id: missing",
		`{"id":"x","conversations":[{"role":"user","content":"q"}]}`:                                                          "ends with a user message",
		`{"id":"x","conversations":[{"role":"assistant","content":"a"}]}`:                                                     "after \"\"",
		`{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"assistant","content":null}]}`:                      "content: missing or not a string",
		`{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"<think>a"}]}`:                "holds <think>",
		`{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"tool","content":"r","tool_call_id":"c"}]}`:         "a tool message after \"user\"",
		`{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":3}]}`: "reasoning_content",
		`{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]},{"role":"tool","content":"r","tool_call_id":"c"},{"role":"assistant","content":"a"}]}`:                                                  "not a JSON object",
		`{"id":"x","tools":[{"type":"function","function":{"name":"g"}}],"conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"r","tool_call_id":"c"},{"role":"assistant","content":"a"}]}`: "is not among the tools",
		`{"id":"x","conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"r","tool_call_id":"d"},{"role":"assistant","content":"a"}]}`:                                                       `"d" answers no pending call`,
	}
	keys := make([]string, 0, len(bad))
	for k := range bad {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, line := range keys {
		err := CheckShareGPTLine([]byte(line))
		if err == nil || !strings.Contains(err.Error(), bad[line]) {
			t.Errorf("CheckShareGPTLine(%s) = %v, want an error containing %q", line, err, bad[line])
		}
	}
}

// TestTrainingFilesHoldAcceptedOnly: rejected samples go to rejected.jsonl
// with rule, evidence and the conversation up to the refused answer, never
// to a training file.
func TestTrainingFilesHoldAcceptedOnly(t *testing.T) {
	rows := contractRows(t)
	rej := turnRow(t, "rej", `{"messages":[{"role":"user","content":"q0"}],"turns":[{"input":[{"role":"user","content":"q1"}]}]}`, "",
		llm.Result{Content: "fine", FinishReason: "stop"}, llm.Result{Content: "loop loop", FinishReason: "length"})
	rej.State, rej.Rule, rej.Reason = store.Rejected, "truncated", "finish_reason length after 0 completion tokens"
	rows = append(rows, rej)
	slices.SortFunc(rows, func(a, b store.Row) int { return strings.Compare(a.ID, b.ID) })
	dir := t.TempDir()
	sum, err := Export(context.Background(), &fakeStore{rows: rows}, dir, Formats, "t")
	if err != nil {
		t.Fatal(err)
	}
	if sum.Done != 4 || sum.Rejected != 1 || sum.Ended != 1 {
		t.Errorf("summary = %+v, want 4 done (1 ended early), 1 rejected", sum)
	}
	for _, f := range []string{"t.sharegpt.jsonl", "t.openai-batch.jsonl"} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if bytes.Contains(b, []byte(`"rej"`)) {
			t.Errorf("%s holds the rejected sample", f)
		}
	}
	lines := readLines(t, filepath.Join(dir, "t.rejected.jsonl"))
	if len(lines) != 1 || lines[0]["rule"] != "truncated" || lines[0]["turn"] != float64(1) || len(lines[0]["conversations"].([]any)) != 4 {
		t.Errorf("rejected.jsonl = %v, want the truncated turn 1 with the 4-message conversation", lines)
	}
}
