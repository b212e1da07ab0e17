// Package tokenrows builds a done sample's training rows as token ids, from
// the ids its servers returned and nothing else (nothing is tokenized or
// decoded here): one row per conversation, or one per assistant turn. Export
// writes these rows; the hidden-state capture sends each row's input ids,
// so the two always agree on what a row is and what it is called.
package tokenrows

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
)

// Seq is a row as the server's token ids: prompt ids followed by
// completion ids, and 1 in LossMask exactly on the ids the model
// generated. Missing, when not empty, says why there are none
// ("unavailable: ...").
type Seq struct {
	InputIDs []int32
	LossMask []int8
	Missing  string
}

// Row is one training row of a sample: ID is the sample id for a whole
// conversation, TurnRowID for a turn row; Turn is the answer's 0-based
// index, -1 for a whole conversation.
type Row struct {
	ID   string
	Turn int
	Seq
}

// Rows are a done sample's training rows from its answers (in turn
// order): the whole conversation, or with perTurn one row per answer.
// engine names the server that answered a turn, for the reasons.
func Rows(sampleID string, answers []llm.Result, perTurn bool, engine func(turn int) string) []Row {
	if !perTurn {
		return []Row{{ID: sampleID, Turn: -1, Seq: Conversation(answers, engine)}}
	}
	out := make([]Row, len(answers))
	for k, a := range answers {
		out[k] = Row{ID: TurnRowID(sampleID, k), Turn: k, Seq: Turn(a, engine(k), k)}
	}
	return out
}

// TurnRowID names turn k's row of a sample: "<sample id>/turn<k>", k
// counted from 1 as the token_ids reasons count turns.
func TurnRowID(sampleID string, k int) string {
	return fmt.Sprintf("%s/turn%d", sampleID, conversation.Ordinal(k))
}

// Conversation is a conversation's row: the last turn's prompt ids
// followed by its completion ids, the mask on every turn's answer. Turn
// k's completion sits in turn k+1's prompt at offset len(turn k's prompt
// ids), which holds when the chat template only appends (a later prompt
// starts with the earlier prompt and answer, id for id); a conversation
// whose ids do not line up says so instead.
func Conversation(answers []llm.Result, engine func(turn int) string) Seq {
	for k, a := range answers {
		if s, bad := unusable(a, engine(k), k); bad {
			return s
		}
	}
	type span struct{ from, to int }
	var spans []span
	for k, a := range answers {
		p, c := a.PromptTokenIDs, a.CompletionTokenIDs
		spans = append(spans, span{len(p), len(p) + len(c)})
		if k+1 == len(answers) {
			break
		}
		next := answers[k+1].PromptTokenIDs
		if len(next) < len(p)+len(c) || !slices.Equal(next[:len(p)], p) || !slices.Equal(next[len(p):len(p)+len(c)], c) {
			return Seq{Missing: fmt.Sprintf("unavailable: turn %d's prompt does not start with turn %d's prompt and answer as generated (the history re-renders it, e.g. reasoning left out): output.token_rows: turn exports this conversation", conversation.Ordinal(k+1), conversation.Ordinal(k))}
		}
	}
	last := answers[len(answers)-1]
	ids := make([]int32, 0, len(last.PromptTokenIDs)+len(last.CompletionTokenIDs))
	ids = append(append(ids, last.PromptTokenIDs...), last.CompletionTokenIDs...)
	mask := make([]int8, len(ids))
	for _, s := range spans {
		for i := s.from; i < s.to; i++ {
			mask[i] = 1
		}
	}
	return Seq{InputIDs: ids, LossMask: mask}
}

// Turn is turn k's own row: the prompt ids the server returned for that
// request, then its completion ids, loss on the completion alone. Any
// template gives these, since nothing is aligned across turns.
func Turn(a llm.Result, engine string, k int) Seq {
	if s, bad := unusable(a, engine, k); bad {
		return s
	}
	ids := make([]int32, 0, len(a.PromptTokenIDs)+len(a.CompletionTokenIDs))
	ids = append(append(ids, a.PromptTokenIDs...), a.CompletionTokenIDs...)
	mask := make([]int8, len(ids))
	for i := len(a.PromptTokenIDs); i < len(ids); i++ {
		mask[i] = 1
	}
	return Seq{InputIDs: ids, LossMask: mask}
}

// unusable says why answer a to turn k has no usable ids, if it has none.
func unusable(a llm.Result, engine string, k int) (Seq, bool) {
	switch {
	case a.TokenIDsUnavailable != "": // a check after the answer found them wrong (dispatch's render check)
		return Seq{Missing: "unavailable: " + a.TokenIDsUnavailable}, true
	case len(a.PromptTokenIDs) == 0 || len(a.CompletionTokenIDs) == 0:
		return Seq{Missing: fmt.Sprintf("unavailable: %s (turn %d has no token ids)", engine, conversation.Ordinal(k))}, true
	case len(a.CompletionTokenIDs) != a.Usage.CompletionTokens:
		return Seq{Missing: fmt.Sprintf("unavailable: turn %d has %d completion ids for %d completion tokens", conversation.Ordinal(k), len(a.CompletionTokenIDs), a.Usage.CompletionTokens)}, true
	}
	return Seq{}, false
}

// InputHash is the sha256 (hex) of a row's input ids as 8-byte
// little-endian integers: the capture records it with each file, and the
// export lists a file only for the row whose ids hash the same.
func InputHash(ids []int32) string {
	b := make([]byte, 8*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(id)))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
