package llm

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestCountTokens: the chat shape sends the messages for the server's
// template and reads vLLM's count; the plain shape sends the messages'
// text as content and counts llama-server's tokens.
func TestCountTokens(t *testing.T) {
	var got map[string]json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = nil
		if err := json.Unmarshal(b, &got); err != nil || r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.Error(w, "bad", 400)
			return
		}
		if _, chat := got["messages"]; chat {
			w.Write([]byte(`{"count":7,"tokens":[1,2,3,4,5,6,7],"max_model_len":4096}`))
			return
		}
		w.Write([]byte(`{"tokens":[9,9,9]}`))
	}))
	defer srv.Close()
	c := New(Config{BaseURL: srv.URL + "/v1"})
	body := json.RawMessage(`{"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":[{"type":"text","text":"12"},{"type":"text","text":"34"}]}]}`)
	n, err := c.CountTokens(t.Context(), "/tokenize", true, "m", body)
	if err != nil || n != 7 || string(got["model"]) != `"m"` || string(got["add_generation_prompt"]) != "true" {
		t.Errorf("chat: %d, %v, sent %s; want 7 with model m and add_generation_prompt", n, err, got)
	}
	n, err = c.CountTokens(t.Context(), "/tokenize", false, "m", body)
	if err != nil || n != 3 || string(got["content"]) != `"Be terse.\n1234\n"` {
		t.Errorf("content: %d, %v, sent %s; want 3 for the messages' text", n, err, got)
	}
}
