package dispatch

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// TestTurnNamesCountFromOne (issue 30 item 7): the reasons people read
// name turns as the views do, "turn 1" for the first (stored turn index
// 0): a conversation that ends after its first answer, and a dead letter
// at the second turn.
func TestTurnNamesCountFromOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		addBodies(st, "short", map[string]string{"text": fmt.Sprintf(toolBody, "text"), "refused": fmt.Sprintf(toolBody, "refused")})
		ts := &turnServer{answer: func(s sent) (llm.Result, error) {
			if s.sample == "refused" && s.turn == 1 {
				return llm.Result{}, &llm.Error{Class: llm.BadRequest, Msg: "context too long"}
			}
			if s.sample == "refused" {
				var c llm.ToolCall
				c.ID, c.Type = "srv-1", "function"
				c.Function.Name, c.Function.Arguments = "book", `{"room":"A"}`
				return llm.Result{ToolCalls: []llm.ToolCall{c}, FinishReason: "tool_calls"}, nil
			}
			return llm.Result{Content: "Which room?", FinishReason: "stop"}, nil
		}}
		d := mustNew(t, baseConfig(st, []Endpoint{{URL: "http://a", Client: ts.chatter()}}))
		if err := d.Run(t.Context()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if x := st.get("text"); x.result.Turn != 0 || !strings.HasPrefix(x.result.EndReason, "turn 1 answered without a tool call") {
			t.Errorf("text: stored turn %d, end reason %q; want index 0 and a reason naming turn 1", x.result.Turn, x.result.EndReason)
		}
		if x := st.get("refused"); x.state != store.Dead || !strings.HasPrefix(x.reason, "turn 2: ") {
			t.Errorf("refused: %s %q; want a dead letter naming turn 2 (index 1)", x.state, x.reason)
		}
	})
}
