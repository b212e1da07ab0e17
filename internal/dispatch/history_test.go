package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// historyBodies are conversations with what a kept history must carry
// over: a system prompt, tools, a seed, tool calls answered by the
// dataset's tool results, and four turns.
func historyBodies(t *testing.T, n int) map[string]string {
	t.Helper()
	raw := func(s string) json.RawMessage {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	seed := int64(7)
	out := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("h-%02d", i)
		var call llm.ToolCall
		call.ID, call.Type = "rec_1", "function"
		call.Function.Name, call.Function.Arguments = "look", `{"q":"`+id+`"}`
		b := conversation.Body{
			Messages: []conversation.Message{{Role: "system", Content: raw("be brief <always> & " + strings.Repeat("s", 300))}, {Role: "user", Content: raw(id)}},
			Tools:    json.RawMessage(`[{"type":"function","function":{"name":"look","parameters":{}}}]`),
			Turns: []conversation.Turn{
				{Input: []conversation.Message{{Role: "user", Content: raw(id + " q1")}}},
				{Calls: []llm.ToolCall{call}, Input: []conversation.Message{{Role: "tool", Content: raw(`{"found":"é"}`), ToolCallID: "rec_1"}}},
				{Input: []conversation.Message{{Role: "user", Content: raw(id + " q3 \u2028")}}},
			},
			Seed: &seed,
		}
		out[id] = string(conversation.Encode(&b))
	}
	return out
}

// recorded is one request as the client got it.
type recorded struct {
	body    []byte
	members []llm.Member
}

// TestKeptHistoryBuildsTheStoresRequest: every turn of a conversation,
// built from what its turn before kept, is byte for byte the request a
// runner builds from the store alone (after a restart: the body and the
// stored answers), tool calls, reasoning kept and characters JSON escapes
// included; the client is handed the body's members so it does not walk
// the history; and next turns did use the kept history.
func TestKeptHistoryBuildsTheStoresRequest(t *testing.T) {
	st := newFakeStore()
	addBodies(st, "short", historyBodies(t, 6))
	var mu sync.Mutex
	got := map[string]recorded{} // by sample/turn
	client := chatFunc(func(ctx context.Context, req llm.Request, onDelta func(int)) (llm.Result, error) {
		var body struct {
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(req.Body, &body); err != nil {
			return llm.Result{}, &llm.Error{Class: llm.Malformed, Msg: err.Error()}
		}
		turn := 0
		for _, m := range body.Messages {
			if m.Role == "assistant" {
				turn++
			}
		}
		mu.Lock()
		got[fmt.Sprintf("%s/%d", req.RoutingKey, turn)] = recorded{bytes.Clone(req.Body), req.Members}
		mu.Unlock()
		onDelta(1)
		res := llm.Result{Content: fmt.Sprintf("answer %d to %s: <b> & \"q\" \u2028 \xff", turn, req.RoutingKey), ReasoningContent: "think <",
			FinishReason: "stop", Usage: llm.Usage{PromptTokens: 100 * (turn + 1), CompletionTokens: 10}}
		if turn == 1 { // the dataset's call, which its tool result answers
			var call llm.ToolCall
			call.ID, call.Type = "call_x", "function"
			call.Function.Name, call.Function.Arguments = "look", `{"q":"`+req.RoutingKey+`"}`
			res.ToolCalls = []llm.ToolCall{call}
		}
		return res, nil
	})
	cfg := baseConfig(st, []Endpoint{{URL: "http://a", Client: client}})
	cfg.KeepReasoning = true
	d := mustNew(t, cfg)
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := len(got); n != 6*4 {
		t.Fatalf("%d requests recorded, want 24 (6 conversations of 4 turns): %v", n, st.states())
	}
	for key, r := range got {
		id, turn, _ := strings.Cut(key, "/")
		x := st.get(id)
		k := int(turn[0] - '0')
		c := store.Claimed{ID: id, Body: x.Body, Turn: k, Prior: append(x.prior, x.result)[:k]}
		want, err := d.prepareTurn(c, nil, nil)
		if err != nil {
			t.Fatalf("%s from the store: %v", key, err)
		}
		if !bytes.Equal(r.body, want.body) {
			t.Errorf("%s sent:\n%s\nbuilt from the store:\n%s", key, r.body, want.body)
		}
		members := map[string]json.RawMessage{}
		for _, m := range r.members {
			members[m.Key] = m.Value
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &top); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(top, members); diff != "" {
			t.Errorf("%s members (-body +members):\n%s", key, diff)
		}
	}
	// A settle that loses the race with the claim of its next turn leaves
	// that turn to the store; most next turns use what the turn before kept.
	if n := d.historyReused.Load(); n < 6 {
		t.Errorf("%d of 18 next turns built from a kept history, want most", n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.adm.byID); n != 0 {
		t.Errorf("%d conversations still held after the run, their histories kept", n)
	}
}

// TestKeptHistoryFitsOnlyItsNextTurn: a kept history is used only for the
// turn after its own, of the same body, with its answer the stored one: an
// answer another worker stored, a changed body or another turn send the
// turn to the store.
func TestKeptHistoryFitsOnlyItsNextTurn(t *testing.T) {
	body := []byte(historyBodies(t, 1)["h-00"])
	p, err := conversation.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := p.Request(0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	answer := []byte(`{"v":1,"content":"mine","finish_reason":"stop"}`)
	tr := &turn{index: 0, plan: p, body: req, stored: answer}
	h := keptHistory(store.Claimed{ID: "h-00", Body: body}, tr, &heldConv{turns: 4})
	if h == nil {
		t.Fatal("no history kept after a turn with a next one")
	}
	next := store.Claimed{ID: "h-00", Body: body, Turn: 1, Prior: []store.Result{{Response: answer, Endpoint: "http://a"}}}
	if !h.fits(next) {
		t.Fatal("the history does not fit its own next turn")
	}
	cases := map[string]func(c *store.Claimed){
		"another answer": func(c *store.Claimed) {
			c.Prior = []store.Result{{Response: []byte(`{"v":1,"content":"theirs","finish_reason":"stop"}`)}}
		},
		"another body":  func(c *store.Claimed) { c.Body = bytes.Replace(body, []byte("h-00"), []byte("h-01"), 1) },
		"the same turn": func(c *store.Claimed) { c.Turn, c.Prior = 0, nil },
		"a later turn": func(c *store.Claimed) {
			c.Turn, c.Prior = 2, append(c.Prior, store.Result{Response: answer})
		},
	}
	for name, change := range cases {
		c := next
		c.Prior = append([]store.Result(nil), next.Prior...)
		change(&c)
		if h.fits(c) {
			t.Errorf("%s: the kept history fits", name)
		}
	}
	if keptHistory(store.Claimed{Body: body}, &turn{index: 3, plan: p, body: req, stored: answer}, &heldConv{turns: 4}) != nil {
		t.Error("a history kept after the last turn")
	}
}
