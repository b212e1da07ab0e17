package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// renderIDs posts a chat request to vLLM's render route.
func renderIDs(t *testing.T, url, body string) []int32 {
	t.Helper()
	var out struct {
		TokenIDs []int32 `json:"token_ids"`
	}
	if err := json.Unmarshal(postJSON(t, url+"/v1/chat/completions/render", body), &out); err != nil {
		t.Fatal(err)
	}
	return out.TokenIDs
}

// TestRender: vLLM's chat render gives the prompt ids the same request is
// generated from, with the drop-reasoning template too (an earlier answer's
// reasoning is sent and left out); --render-skew changes one id, the last of
// the last user message, of the matching requests only; a previous-API
// server has no render route.
func TestRender(t *testing.T) {
	c := testConfig()
	c.Engine = EngineVLLM
	c.ChatTemplate = TemplateDropReasoning
	c.RenderSkew = "SKEW"
	_, url, _ := startServer(t, c)
	msgs := func(last string) string {
		return fmt.Sprintf(`[{"role":"system","content":"Be brief."},{"role":"user","content":"first question"},`+
			`{"role":"assistant","content":"an answer","reasoning_content":"long thought"},{"role":"user","content":%q}]`, last)
	}
	for _, tt := range []struct {
		last string
		skew bool
	}{{"second question", false}, {"second SKEW question", true}} {
		body := fmt.Sprintf(`{"model":"m","messages":%s,"max_tokens":8,"chat_template_kwargs":{"thinking":true}}`, msgs(tt.last))
		got := renderIDs(t, url, body)
		var gen struct {
			PromptTokenIDs []int32 `json:"prompt_token_ids"`
		}
		if err := json.Unmarshal(postJSON(t, url+"/v1/chat/completions", strings.Replace(body, `"max_tokens":8`, `"max_tokens":8,"return_token_ids":true`, 1)), &gen); err != nil {
			t.Fatal(err)
		}
		var diff []int
		for i := range max(len(got), len(gen.PromptTokenIDs)) {
			if i >= len(got) || i >= len(gen.PromptTokenIDs) || got[i] != gen.PromptTokenIDs[i] {
				diff = append(diff, i)
			}
		}
		want := []int(nil)
		if tt.skew {
			want = []int{len(gen.PromptTokenIDs) - 6} // before the 2-id end marker and the 3-id generation prompt
		}
		if !cmp.Equal(want, diff) || len(got) == 0 {
			t.Errorf("%q: render differs from the generated prompt ids at %v, want %v (%d and %d ids)", tt.last, diff, want, len(got), len(gen.PromptTokenIDs))
		}
	}
	noPrompt := renderIDs(t, url, fmt.Sprintf(`{"model":"m","messages":%s,"add_generation_prompt":false}`, msgs("second question")))
	withPrompt := renderIDs(t, url, fmt.Sprintf(`{"model":"m","messages":%s}`, msgs("second question")))
	if len(withPrompt)-len(noPrompt) != 3 {
		t.Errorf("add_generation_prompt false: %d ids, true: %d; want 3 fewer", len(noPrompt), len(withPrompt))
	}

	c.APIShape = ShapePrevious
	_, old, _ := startServer(t, c)
	resp, err := http.Post(old+"/v1/chat/completions/render", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("previous API: render answered %d, want 404", resp.StatusCode)
	}
}
