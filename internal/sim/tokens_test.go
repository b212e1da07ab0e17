package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
)

// chatTurns runs a two-turn conversation through regen's own client: turn
// 0, then turn 1 with turn 0's answer in the history the way regen sends
// it (reasoning kept or not) followed by a user message, or by a tool
// result when the answer called a tool.
func chatTurns(t *testing.T, c *llm.Client, extra string, keepReasoning bool) (r0, r1 llm.Result) {
	t.Helper()
	ctx := context.Background()
	first := []conversation.Message{
		{Role: "system", Content: json.RawMessage(`"You are terse."`)},
		{Role: "user", Content: json.RawMessage(`"Count the apples: 3 + 4 = ?"`)},
	}
	body := func(msgs []conversation.Message) []byte {
		b, _ := json.Marshal(msgs)
		return []byte(`{"messages":` + string(b) + extra + `}`)
	}
	r0, err := c.Chat(ctx, llm.Request{Model: "m", Body: body(first), MaxTokens: 200}, nil)
	if err != nil {
		t.Fatalf("turn 0: %v", err)
	}
	next := conversation.Message{Role: "user", Content: json.RawMessage(`"And now with pears?"`)}
	if len(r0.ToolCalls) > 0 {
		next = conversation.Message{Role: "tool", ToolCallID: r0.ToolCalls[0].ID, Content: json.RawMessage(`"7 apples"`)}
	}
	second := append(slices.Clone(first), conversation.Answer(0, r0, keepReasoning), next)
	r1, err = c.Chat(ctx, llm.Request{Model: "m", Body: body(second), MaxTokens: 200}, nil)
	if err != nil {
		t.Fatalf("turn 1: %v", err)
	}
	return r0, r1
}

// TestTokenIDs checks the simulator's token ids through regen's client, in
// both dialects: as many ids as usage counts, deterministic, and turn 0's
// prompt and answer ids at the head of turn 1's prompt whenever the
// history carries the whole answer (reasoning kept or none generated).
func TestTokenIDs(t *testing.T) {
	cfg := testConfig()
	cfg.ToolCallFraction = 1
	_, url, _ := startServer(t, cfg)
	const tools = `,"tools":[{"type":"function","function":{"name":"lookup","parameters":{}}}]`
	const thinking = `,"chat_template_kwargs":{"thinking":true}`
	dialects := map[string][]string{
		"vllm":   {"return_token_ids"},
		"sglang": {"return_input_ids_in_sglext", "return_output_ids_in_sglext"},
	}
	tests := []struct {
		name          string
		extra         string
		keepReasoning bool
		wantPrefix    bool
	}{
		{"plain", "", false, true},
		{"tool call and result", tools, false, true},
		{"thinking kept", thinking, true, true},
		{"thinking kept with tools", thinking + tools, true, true},
		// The history leaves the reasoning out: turn 0's answer is not in
		// turn 1's prompt as it was generated.
		{"thinking stripped", thinking, false, false},
	}
	for dialect, fields := range dialects {
		c := llm.New(llm.Config{BaseURL: url, TokenIDFields: fields})
		t.Cleanup(c.Close)
		for _, tt := range tests {
			t.Run(dialect+"/"+tt.name, func(t *testing.T) {
				r0, r1 := chatTurns(t, c, tt.extra, tt.keepReasoning)
				for i, r := range []llm.Result{r0, r1} {
					if len(r.PromptTokenIDs) != r.Usage.PromptTokens || len(r.CompletionTokenIDs) != r.Usage.CompletionTokens || len(r.CompletionTokenIDs) == 0 {
						t.Errorf("turn %d: %d prompt ids, %d completion ids; usage says %d and %d",
							i, len(r.PromptTokenIDs), len(r.CompletionTokenIDs), r.Usage.PromptTokens, r.Usage.CompletionTokens)
					}
				}
				if tt.extra == tools && len(r0.ToolCalls) == 0 {
					t.Fatalf("turn 0 called no tool (finish %s)", r0.FinishReason)
				}
				head := append(slices.Clone(r0.PromptTokenIDs), r0.CompletionTokenIDs...)
				got := len(r1.PromptTokenIDs) > len(head) && slices.Equal(r1.PromptTokenIDs[:len(head)], head)
				if got != tt.wantPrefix {
					t.Errorf("turn 0's prompt+answer ids at the head of turn 1's prompt: %v, want %v\nturn 0: %v + %v\nturn 1: %v",
						got, tt.wantPrefix, r0.PromptTokenIDs, r0.CompletionTokenIDs, r1.PromptTokenIDs)
				}
				again, _ := chatTurns(t, c, tt.extra, tt.keepReasoning)
				if !slices.Equal(again.PromptTokenIDs, r0.PromptTokenIDs) || !slices.Equal(again.CompletionTokenIDs, r0.CompletionTokenIDs) {
					t.Errorf("the same request gave other ids")
				}
			})
		}
	}
}

// TestTokenIDsOff: a request that does not ask gets no ids, and the prompt
// is counted as before (the byte estimate), so jobs without token ids see
// the same simulator.
func TestTokenIDsOff(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	plain := llm.New(llm.Config{BaseURL: url})
	t.Cleanup(plain.Close)
	body := []byte(`{"messages":[{"role":"user","content":"Say something about caches and queues."}]}`)
	r, err := plain.Chat(context.Background(), llm.Request{Model: "m", Body: body, MaxTokens: 50}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.PromptTokenIDs != nil || r.CompletionTokenIDs != nil {
		t.Errorf("ids not asked for, got %d and %d", len(r.PromptTokenIDs), len(r.CompletionTokenIDs))
	}
	content := `"Say something about caches and queues."`
	if want := estimateTokens(len(content), testConfig().BytesPerToken) + 4; r.Usage.PromptTokens != want {
		t.Errorf("prompt_tokens = %d, want the estimate %d", r.Usage.PromptTokens, want)
	}
}

// TestWholeTokenIDs: a non-streamed answer carries the ids where each
// engine puts them.
func TestWholeTokenIDs(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	for _, tt := range []struct{ field, promptPath, outPath string }{
		{`"return_token_ids":true`, "prompt_token_ids", "choices.0.token_ids"},
		{`"return_input_ids_in_sglext":true,"return_output_ids_in_sglext":true`, "sglext.input_ids", "sglext.output_ids.0"},
	} {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":30,%s}`, tt.field)
		resp := postJSON(t, url+"/v1/chat/completions", body)
		var out struct {
			PromptTokenIDs []int32 `json:"prompt_token_ids"`
			Choices        []struct {
				TokenIDs []int32 `json:"token_ids"`
			} `json:"choices"`
			SGLExt struct {
				InputIDs  []int32   `json:"input_ids"`
				OutputIDs [][]int32 `json:"output_ids"`
			} `json:"sglext"`
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal(resp, &out); err != nil {
			t.Fatalf("%s: %v: %s", tt.field, err, resp)
		}
		in, gen := out.PromptTokenIDs, []int32(nil)
		if len(out.Choices) > 0 {
			gen = out.Choices[0].TokenIDs
		}
		if in == nil {
			in = out.SGLExt.InputIDs
			if len(out.SGLExt.OutputIDs) == 1 {
				gen = out.SGLExt.OutputIDs[0]
			}
		}
		if len(in) != out.Usage.PromptTokens || len(gen) != out.Usage.CompletionTokens || len(gen) == 0 {
			t.Errorf("%s: %d prompt ids (%s), %d completion ids (%s); usage %d and %d",
				tt.field, len(in), tt.promptPath, len(gen), tt.outPath, out.Usage.PromptTokens, out.Usage.CompletionTokens)
		}
	}
}

func postJSON(t *testing.T, url, body string) []byte {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %v: %s", url, resp.StatusCode, err, b)
	}
	return b
}

// TestDropReasoningTemplate: with the drop-reasoning chat template an
// earlier answer's reasoning is not in the next prompt even when the
// history sends it (Kimi-K2.5's template), so turn 1's prompt starts with
// turn 0's prompt but not with turn 0's prompt and answer as generated;
// an answer without reasoning still comes back whole.
func TestDropReasoningTemplate(t *testing.T) {
	cfg := testConfig()
	cfg.ChatTemplate = TemplateDropReasoning
	_, url, _ := startServer(t, cfg)
	c := llm.New(llm.Config{BaseURL: url, TokenIDFields: []string{"return_token_ids"}})
	t.Cleanup(c.Close)
	for _, tt := range []struct {
		name       string
		extra      string
		wantPrefix bool
	}{
		{"thinking sent back", `,"chat_template_kwargs":{"thinking":true}`, false},
		{"no thinking", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r0, r1 := chatTurns(t, c, tt.extra, true)
			if tt.extra != "" && r0.ReasoningContent == "" {
				t.Fatal("turn 0 generated no reasoning")
			}
			if !slices.Equal(r1.PromptTokenIDs[:len(r0.PromptTokenIDs)], r0.PromptTokenIDs) {
				t.Errorf("turn 1's prompt does not start with turn 0's prompt")
			}
			head := append(slices.Clone(r0.PromptTokenIDs), r0.CompletionTokenIDs...)
			got := len(r1.PromptTokenIDs) > len(head) && slices.Equal(r1.PromptTokenIDs[:len(head)], head)
			if got != tt.wantPrefix {
				t.Errorf("turn 0's prompt+answer ids at the head of turn 1's prompt: %v, want %v", got, tt.wantPrefix)
			}
		})
	}
	bad := testConfig()
	bad.ChatTemplate = "jinja"
	if err := bad.validate(); err == nil || !strings.Contains(err.Error(), "chat-template") {
		t.Errorf("Validate with chat template %q: %v; want an error naming chat-template", bad.ChatTemplate, err)
	}
}
