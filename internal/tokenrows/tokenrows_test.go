package tokenrows

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
)

func answer(prompt, completion []int32) llm.Result {
	return llm.Result{PromptTokenIDs: prompt, CompletionTokenIDs: completion,
		Usage: llm.Usage{PromptTokens: len(prompt), CompletionTokens: len(completion)}}
}

// TestRows: a whole conversation is one row under the sample's id; per
// turn, each answer is a row of its own prompt and completion ids named
// <id>/turn<k> with k from 1, also where the conversation's ids do not
// line up (a re-rendered history).
func TestRows(t *testing.T) {
	engine := func(int) string { return "vllm" }
	t0 := answer([]int32{1, 2}, []int32{10})
	t1 := answer([]int32{1, 2, 3}, []int32{20, 21}) // turn 0's answer left out of the history
	if got := Rows("p/a", []llm.Result{t0}, false, engine); len(got) != 1 || got[0].ID != "p/a" || got[0].Turn != -1 ||
		!cmp.Equal(got[0].InputIDs, []int32{1, 2, 10}) {
		t.Errorf("conversation rows = %+v", got)
	}
	conv := Rows("p/a", []llm.Result{t0, t1}, false, engine)
	if len(conv) != 1 || conv[0].Missing == "" || conv[0].InputIDs != nil {
		t.Errorf("conversation rows of a re-rendered history = %+v, want one with a reason and no ids", conv)
	}
	want := []Row{
		{ID: "p/a/turn1", Turn: 0, Seq: Seq{InputIDs: []int32{1, 2, 10}, LossMask: []int8{0, 0, 1}}},
		{ID: "p/a/turn2", Turn: 1, Seq: Seq{InputIDs: []int32{1, 2, 3, 20, 21}, LossMask: []int8{0, 0, 0, 1, 1}}},
	}
	if d := cmp.Diff(want, Rows("p/a", []llm.Result{t0, t1}, true, engine)); d != "" {
		t.Errorf("turn rows (-want +got):\n%s", d)
	}
	noIDs := Rows("p/b", []llm.Result{{Usage: llm.Usage{CompletionTokens: 1}}}, true, func(int) string { return "llamacpp" })
	if noIDs[0].Missing != "unavailable: llamacpp (turn 1 has no token ids)" {
		t.Errorf("turn row without ids: %q", noIDs[0].Missing)
	}
}

// TestInputHash: the hash is over each id as an 8-byte little-endian
// integer, sign-extended, as the capture records it: a negative id
// hashes as int64 -1, not as uint32.
func TestInputHash(t *testing.T) {
	b := []byte{1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	sum := sha256.Sum256(b)
	if got, want := InputHash([]int32{1, -1}), hex.EncodeToString(sum[:]); got != want {
		t.Errorf("InputHash([1 -1]) = %s, want %s", got, want)
	}
	if InputHash([]int32{1, 2}) == InputHash([]int32{2, 1}) {
		t.Error("the order of the ids does not change the hash")
	}
}
