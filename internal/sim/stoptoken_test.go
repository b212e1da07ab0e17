package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
)

// TestCompletionIDsEndWithTheStopToken pins where the simulator puts a
// turn's end, as vLLM and SGLang do (their stop checks read the last output
// id, already appended: docs/training-data.md, "The loss mask and the end
// of a turn"): a turn that ends by a stop returns its words and then the
// end token (idEnd) among its completion ids (vLLM's token_ids, SGLang's
// sglext output_ids), and usage counts it; the template's idNL after it
// comes first in the next turn's prompt, which starts with the previous
// prompt and completion exactly, as Qwen's "<|im_end|>\n" does.
func TestCompletionIDsEndWithTheStopToken(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	for dialect, fields := range map[string][]string{
		"vllm":   {"return_token_ids"},
		"sglang": {"return_input_ids_in_sglext", "return_output_ids_in_sglext"},
	} {
		c := llm.New(llm.Config{BaseURL: url, TokenIDFields: fields})
		t.Cleanup(c.Close)
		r0, r1 := chatTurns(t, c, "", false)
		if r0.FinishReason != "stop" {
			t.Fatalf("%s: turn 0 finished %q, want stop", dialect, r0.FinishReason)
		}
		ids := r0.CompletionTokenIDs
		if len(ids) != r0.Usage.CompletionTokens || len(ids) < 2 || ids[len(ids)-1] != idEnd || slices.Contains(ids[:len(ids)-1], idEnd) {
			t.Errorf("%s: %d completion ids for %d completion tokens, want the words then one end token %d: %v", dialect, len(ids), r0.Usage.CompletionTokens, idEnd, ids)
		}
		prev := append(slices.Clone(r0.PromptTokenIDs), ids...)
		if !slices.Equal(r1.PromptTokenIDs[:min(len(prev), len(r1.PromptTokenIDs))], prev) {
			t.Errorf("%s: turn 1's prompt does not start with turn 0's prompt and completion ids", dialect)
		}
		at := len(prev)
		if len(r1.PromptTokenIDs) <= at+1 || r1.PromptTokenIDs[at] != idNL || r1.PromptTokenIDs[at+1] != idStart {
			t.Errorf("%s: turn 1's prompt after turn 0's answer is not the template's newline and the next message: %v", dialect, r1.PromptTokenIDs[min(at, len(r1.PromptTokenIDs)):])
		}
		t.Logf("%s: %d completion ids, %d completion tokens, the last %d; turn 1's prompt goes on with %v", dialect, len(ids), r0.Usage.CompletionTokens, ids[len(ids)-1], r1.PromptTokenIDs[at:min(at+3, len(r1.PromptTokenIDs))])
	}
}

// TestLengthCutHasNoStopToken: a turn cut by max_tokens sampled no end
// token, so its ids are the words alone, as many as usage counts; a whole
// (not streamed) answer that stopped carries the end token as a streamed
// one does.
func TestLengthCutHasNoStopToken(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	whole := func(maxTokens string) (reason string, ids []int32, completion int) {
		t.Helper()
		body := `{"model":"m","messages":[{"role":"user","content":"Count the apples."}],"return_token_ids":true,"max_tokens":` + maxTokens + `}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				FinishReason string  `json:"finish_reason"`
				TokenIDs     []int32 `json:"token_ids"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("max_tokens %s: %d choices, %v", maxTokens, len(out.Choices), err)
		}
		return out.Choices[0].FinishReason, out.Choices[0].TokenIDs, out.Usage.CompletionTokens
	}
	reason, ids, n := whole("3")
	if reason != "length" || len(ids) != 3 || n != 3 || slices.Contains(ids, idEnd) {
		t.Errorf("max_tokens 3: finish %q, %d ids for %d completion tokens, end token among them: %v", reason, len(ids), n, slices.Contains(ids, idEnd))
	}
	reason, ids, n = whole("2000")
	if reason != "stop" || len(ids) != n || len(ids) == 0 || ids[len(ids)-1] != idEnd {
		t.Errorf("max_tokens 2000: finish %q, %d ids for %d completion tokens, ending %v", reason, len(ids), n, ids[max(len(ids)-1, 0):])
	}
}

// TestLlamaCppCountsAsBefore: the llama-server dialect returns no ids on
// chat completions and the simulator keeps its count of a stopped answer
// at the words it streamed, while SGLang's counts the stop token too
// (docs/engines.md §10.5).
func TestLlamaCppCountsAsBefore(t *testing.T) {
	for engine, stop := range map[string]int{EngineLlamaCpp: 0, EngineSGLang: 1} {
		c := testConfig()
		c.Engine = engine
		_, url, _ := startServer(t, c)
		r := streamChat(http.DefaultClient, url, chatBody("count the pears", 2000, ""))
		if r.err != nil || r.finish != "stop" || r.usage == nil {
			t.Fatalf("%s: err %v, finish %q, usage %v", engine, r.err, r.finish, r.usage)
		}
		if words := len(strings.Fields(r.content)); r.usage.CompletionTokens != words+stop {
			t.Errorf("%s: completion_tokens %d for %d words, want %d", engine, r.usage.CompletionTokens, words, words+stop)
		}
	}
}
