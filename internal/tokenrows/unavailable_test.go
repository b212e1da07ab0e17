package tokenrows

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
)

// TestTokenIDsUnavailable: an answer whose ids a check found wrong (the
// render check) makes its turn row, and its conversation's row, a row
// without ids with the check's reason, although the server returned ids.
func TestTokenIDsUnavailable(t *testing.T) {
	engine := func(int) string { return "vllm" }
	first := llm.Result{PromptTokenIDs: []int32{1}, CompletionTokenIDs: []int32{10}, Usage: llm.Usage{PromptTokens: 1, CompletionTokens: 1}}
	second := llm.Result{PromptTokenIDs: []int32{1, 10, 2}, CompletionTokenIDs: []int32{20}, Usage: llm.Usage{PromptTokens: 3, CompletionTokens: 1}}
	if got := Turn(second, "vllm", 1); len(got.InputIDs) != 4 || got.Missing != "" {
		t.Fatalf("turn with ids: %+v", got)
	}
	second.TokenIDsUnavailable = "turn 2's prompt ids differ from the server's render at index 2"
	want := Seq{Missing: "unavailable: turn 2's prompt ids differ from the server's render at index 2"}
	rows := Rows("s", []llm.Result{first, second}, true, engine)
	if diff := cmp.Diff(want, rows[1].Seq); diff != "" || rows[0].Missing != "" || rows[1].ID != "s/turn2" {
		t.Errorf("turn rows %+v; turn 2 (-want +got):\n%s", rows, diff)
	}
	if diff := cmp.Diff(want, Conversation([]llm.Result{first, second}, engine)); diff != "" {
		t.Errorf("conversation row (-want +got):\n%s", diff)
	}
}
