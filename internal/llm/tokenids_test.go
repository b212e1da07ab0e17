package llm

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestChatTokenIDs asks for token ids in each engine's dialect and reads
// them from each engine's stream shape: vLLM's prompt_token_ids in the
// first chunk plus token_ids per choice chunk, SGLang's sglext chunk.
func TestChatTokenIDs(t *testing.T) {
	tests := []struct {
		name       string
		fixture    string
		fields     []string
		wantFields map[string]bool // request keys that must be true; others absent
		wantPrompt []int32
		wantOut    []int32
		wantText   string
	}{
		{
			name: "vllm", fixture: "vllm_token_ids.sse", fields: []string{"return_token_ids"},
			wantFields: map[string]bool{"return_token_ids": true},
			wantPrompt: []int32{151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198},
			// A chunk with ids and no text (the </think> token) still counts.
			wantOut:  []int32{151667, 80022, 151668, 19, 17, 151645},
			wantText: "42",
		},
		{
			name: "sglang", fixture: "sglang_sglext.sse", fields: []string{"return_input_ids_in_sglext", "return_output_ids_in_sglext"},
			wantFields: map[string]bool{"return_input_ids_in_sglext": true, "return_output_ids_in_sglext": true},
			wantPrompt: []int32{163584, 1008, 3621, 163585, 1009},
			wantOut:    []int32{19180, 1758, 163586},
			wantText:   "Hello there",
		},
		{
			// Not asked: the request carries no extra field, and a stream
			// without ids leaves the result without them.
			name: "off", fixture: "sglang_plain.sse",
		},
	}
	idKeys := []string{"return_token_ids", "return_input_ids_in_sglext", "return_output_ids_in_sglext"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := readFixture(t, tt.fixture)
			var body map[string]json.RawMessage
			_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if err := json.Unmarshal(b, &body); err != nil {
					t.Errorf("request body: %v", err)
				}
				writeEvents(w, text)
			}, Config{TokenIDFields: tt.fields})
			res, err := c.Chat(bg(t), testRequest(), nil)
			if err != nil {
				t.Fatalf("Chat: %v", err)
			}
			for _, k := range idKeys {
				v, sent := body[k]
				if want := tt.wantFields[k]; sent != want || (sent && string(v) != "true") {
					t.Errorf("request field %s = %s (sent %v), want sent %v as true", k, v, sent, want)
				}
			}
			if diff := cmp.Diff(tt.wantPrompt, res.PromptTokenIDs); diff != "" {
				t.Errorf("prompt ids (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOut, res.CompletionTokenIDs); diff != "" {
				t.Errorf("completion ids (-want +got):\n%s", diff)
			}
			if tt.wantText != "" && res.Content != tt.wantText {
				t.Errorf("content = %q, want %q", res.Content, tt.wantText)
			}
			if tt.wantOut != nil && len(res.CompletionTokenIDs) != res.Usage.CompletionTokens {
				t.Errorf("%d completion ids for usage.completion_tokens %d", len(res.CompletionTokenIDs), res.Usage.CompletionTokens)
			}
			// The stored answer keeps them, and leaves them out when empty.
			b, _ := json.Marshal(res)
			var back Result
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(res.CompletionTokenIDs, back.CompletionTokenIDs); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			var keys map[string]json.RawMessage
			json.Unmarshal(b, &keys)
			if _, ok := keys["prompt_token_ids"]; ok != (tt.wantPrompt != nil) {
				t.Errorf("stored answer has prompt_token_ids: %v, want %v", ok, tt.wantPrompt != nil)
			}
		})
	}
}
