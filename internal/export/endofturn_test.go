package export

import (
	"slices"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// TestLossMaskEndOfTurn: with an engine that returns the stop token among
// the completion ids (vLLM and SGLang do; 7 here, Qwen's <|im_end|>), the
// mask covers it, as both trainers' masks do; the template's ids after it
// (8, the "\n" of Qwen's "<|im_end|>\n") sit in the next turn's prompt
// and stay 0: regen cannot tell them from the next message's header
// without the tokenizer. A turn row ends with its completion, so it has no
// such ids at all.
func TestLossMaskEndOfTurn(t *testing.T) {
	const stop, nl = 7, 8
	p0 := ids(1, 10, 3, 50, stop, nl, 1, 12, 3)
	a0 := answer(p0, ids(40, 41, stop))
	p1 := append(append(slices.Clone(p0), a0.CompletionTokenIDs...), nl, 1, 11, 3, 51, stop, nl, 1, 12, 3)
	a1 := answer(p1, ids(60, stop))
	conv := tokenSequence([]llm.Result{a0, a1}, func(int) string { return "vllm" })
	if conv.Missing != "" {
		t.Fatal(conv.Missing)
	}
	var masked []int32
	for i, m := range conv.LossMask {
		if m == 1 {
			masked = append(masked, conv.InputIDs[i])
		}
	}
	if want := ids(40, 41, stop, 60, stop); !slices.Equal(masked, want) {
		t.Errorf("masked ids %v, want %v (every answer through its stop token)", masked, want)
	}
	if at := len(p0) + 3; conv.InputIDs[at] != nl || conv.LossMask[at] != 0 {
		t.Errorf("the id after turn 1's stop token: %d masked %d; want %d unmasked", conv.InputIDs[at], conv.LossMask[at], nl)
	}
	row := tokenrows.Turn(a1, "vllm", 1)
	if n := len(row.LossMask); row.InputIDs[n-1] != stop || row.LossMask[n-1] != 1 || row.LossMask[n-3] != 0 {
		t.Errorf("turn row ends %v mask %v; want the stop token last and masked, the prompt not", row.InputIDs[n-3:], row.LossMask[n-3:])
	}
}
