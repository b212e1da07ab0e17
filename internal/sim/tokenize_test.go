package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestTokenize: the llama.cpp and vLLM modes count a prompt at their
// /tokenize routes as a chat request is charged for it (bytes_per_token
// 1 here, digit-heavy text), in each engine's answer shape; the llama.cpp
// model card's meta.n_ctx is one slot's context, as /props' is.
func TestTokenize(t *testing.T) {
	digits := strings.Repeat("0123456789", 50) // 500 bytes
	for _, tc := range []struct {
		engine, body string
		want         int
	}{
		{EngineLlamaCpp, `{"content":"` + digits + `"}`, 500},
		{EngineVLLM, `{"model":"m","prompt":"` + digits + `"}`, 500},
		// One message: its JSON string (quotes included) plus 4 template tokens.
		{EngineVLLM, `{"model":"m","messages":[{"role":"user","content":"` + digits + `"}]}`, 506},
	} {
		c := testConfig()
		c.Engine, c.BytesPerToken, c.Slots, c.ContextLen = tc.engine, 1, 4, 4096
		_, url, _ := startServer(t, c)
		resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Tokens []int32 `json:"tokens"`
			Count  *int    `json:"count"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s /tokenize: HTTP %d, %v", tc.engine, resp.StatusCode, err)
		}
		if len(got.Tokens) != tc.want || (tc.engine == EngineVLLM) != (got.Count != nil) || (got.Count != nil && *got.Count != tc.want) {
			t.Errorf("%s %s: %d tokens, count %v; want %d", tc.engine, tc.body[:20], len(got.Tokens), got.Count, tc.want)
		}
		if tc.engine != EngineLlamaCpp {
			continue
		}
		resp, err = http.Get(url + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		var models struct {
			Data []struct {
				Meta struct {
					NCtx int `json:"n_ctx"`
				} `json:"meta"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&models)
		resp.Body.Close()
		if err != nil || len(models.Data) != 1 || models.Data[0].Meta.NCtx != 1024 {
			t.Errorf("model card %+v (%v); want meta.n_ctx 1024, one of 4 slots of 4096", models, err)
		}
	}
}
