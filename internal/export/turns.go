package export

import (
	"fmt"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// Token row modes (output.token_rows): one training row per conversation,
// or one per assistant turn.
const (
	TokenRowsConversation = "conversation"
	TokenRowsTurn         = "turn"
)

// turnRowID names turn k's row of a sample (tokenrows.TurnRowID).
func turnRowID(sampleID string, k int) string { return tokenrows.TurnRowID(sampleID, k) }

// turnKeys are what a turn row adds to a ShareGPT line: the conversation
// (sample) it belongs to and its turn, counted from 1.
type turnKeys struct {
	ConversationID string `json:"conversation_id"`
	Turn           int    `json:"turn"`
}

// rows are the training rows of a done record: itself, or with turn rows
// one record per answer, each holding the conversation up to that answer
// (earlier answers' reasoning only when the history kept it, as the
// server was sent it), that answer's run details and its own token ids.
func (r *record) rows() ([]*record, error) { return r.rowsOf(r.turnRows) }

// rowsOf is rows with turn rows when turns, whatever Options.TokenRows
// (SpecForge's ShareGPT rows are turns with or without token ids).
func (r *record) rowsOf(turns bool) ([]*record, error) {
	if !turns {
		return []*record{r}, nil
	}
	out := make([]*record, len(r.answers))
	for k := range r.answers {
		t, err := r.turnRow(k)
		if err != nil {
			return nil, err
		}
		out[k] = t
	}
	return out, nil
}

// turnRow is turn k of r as a record of its own.
func (r *record) turnRow(k int) (*record, error) {
	t := *r
	t.conversationID, t.turn = r.row.ID, k
	t.row.ID = turnRowID(r.row.ID, k)
	t.answers, t.provs, t.res = r.answers[:k+1], r.provs[:k+1], r.answers[k]
	if k < len(r.row.Prior) {
		p := r.row.Prior[k]
		t.row.Result, t.row.Lane, t.row.Attempts, t.row.Prior = p, p.Lane, p.Attempts, r.row.Prior[:k]
	}
	conv, err := r.plan.Conversation(t.answers)
	if err != nil {
		return nil, fmt.Errorf("sample %s turn %d: %w", r.row.ID, conversation.Ordinal(k), err)
	}
	if !r.keepHistoryReasoning {
		conv = withoutEarlierReasoning(conv)
	}
	t.conv = conv
	toks := tokenrows.Turn(r.answers[k], r.engineOf(k), k)
	t.toks = &toks
	return &t, nil
}

// withoutEarlierReasoning is conv as the server was sent it with
// generation.reasoning strip_history: every assistant message but the last
// (the turn's own answer) without its reasoning, so a turn row's text says
// what its input_ids hold.
func withoutEarlierReasoning(conv []conversation.Message) []conversation.Message {
	last := -1
	for i, m := range conv {
		if m.Role == "assistant" {
			last = i
		}
	}
	for i := range conv {
		if conv[i].Role == "assistant" && i != last {
			conv[i].ReasoningContent = ""
		}
	}
	return conv
}

// rowIDs are the training row ids of r (Verify passes over them together).
func (r *record) rowIDs() []string {
	if !(r.turnRows || r.specForge) || r.row.State != store.Done {
		return []string{r.row.ID}
	}
	ids := make([]string, len(r.row.Prior)+1)
	for k := range ids {
		ids[k] = turnRowID(r.row.ID, k)
	}
	// The conversation's id too: the batch file has one line a sample
	// whatever the rows, and without turn rows Parquet has the conversation.
	return append(ids, r.row.ID)
}

// turnFields is what a turn row adds to a line; nil for a conversation row.
func (r *record) turnFields() *turnKeys {
	if r.conversationID == "" {
		return nil
	}
	return &turnKeys{ConversationID: r.conversationID, Turn: conversation.Ordinal(r.turn)}
}
