package sim

import (
	"slices"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
)

// TestCompletionIDsEndBeforeTheEndToken measures where the simulator puts
// a turn's end: its completion ids (vLLM's token_ids, SGLang's sglext
// output_ids) are the generated words alone, as many as usage counts,
// and the end token (idEnd) its template writes after an answer shows
// only in the next turn's prompt, right after them. vLLM and SGLang
// differ: they decide a stop on the last id of the output ids, so the
// stop token is among the ids they return (docs/training-data.md, "The
// loss mask and the end of a turn"); export's loss_mask covers exactly
// the returned completion ids in both cases.
func TestCompletionIDsEndBeforeTheEndToken(t *testing.T) {
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
		if len(ids) != r0.Usage.CompletionTokens || slices.Contains(ids, idEnd) {
			t.Errorf("%s: %d completion ids for %d completion tokens, end token among them: %v", dialect, len(ids), r0.Usage.CompletionTokens, slices.Contains(ids, idEnd))
		}
		at := len(r0.PromptTokenIDs) + len(ids)
		if len(r1.PromptTokenIDs) <= at || r1.PromptTokenIDs[at] != idEnd {
			t.Errorf("%s: turn 1's prompt after turn 0's answer is not the end token: %v", dialect, r1.PromptTokenIDs[min(at, len(r1.PromptTokenIDs)):])
		}
		t.Logf("%s: %d completion ids, the last %d; turn 1's prompt goes on with %v", dialect, len(ids), ids[len(ids)-1], r1.PromptTokenIDs[at:min(at+4, len(r1.PromptTokenIDs))])
	}
}
