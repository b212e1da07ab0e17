package llm

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRenderChat: the render request is the chat request as Chat sends it
// (messages, tools, generation settings, model) without streaming, and the
// answer's token_ids come back; an answer without them is malformed.
func TestRenderChat(t *testing.T) {
	var got map[string]json.RawMessage
	answer := `{"request_id":"x","token_ids":[1,12,3,500,2,1,12,3],"features":null,"sampling_params":{},"model":"m"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = nil
		if err := json.Unmarshal(b, &got); err != nil || r.URL.Path != "/v1/chat/completions/render" {
			http.Error(w, "bad", 400)
			return
		}
		w.Write([]byte(answer))
	}))
	defer srv.Close()
	c := New(Config{BaseURL: srv.URL + "/v1", TokenIDFields: []string{"return_token_ids"}})
	req := Request{Model: "m", MaxTokens: 64, Body: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`),
		Params: map[string]json.RawMessage{"chat_template_kwargs": json.RawMessage(`{"thinking":true}`)}}
	ids, err := c.RenderChat(t.Context(), "/v1/chat/completions/render", req)
	if err != nil || !cmp.Equal(ids, []int32{1, 12, 3, 500, 2, 1, 12, 3}) {
		t.Fatalf("RenderChat = %v, %v", ids, err)
	}
	for _, k := range []string{"messages", "tools", "chat_template_kwargs", "model", "max_tokens"} {
		if _, ok := got[k]; !ok {
			t.Errorf("render request has no %s: %s", k, got)
		}
	}
	for _, k := range []string{"stream", "stream_options"} {
		if _, ok := got[k]; ok {
			t.Errorf("render request has %s: %s", k, got)
		}
	}
	answer = `{"request_id":"x"}`
	var e *Error
	if _, err := c.RenderChat(t.Context(), "/v1/chat/completions/render", req); !errors.As(err, &e) || e.Class != Malformed {
		t.Errorf("answer without token_ids: %v, want a Malformed error", err)
	}
}
