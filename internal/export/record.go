package export

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/store"
)

// assistant is the generated turn in OpenAI's shape. Content is null when
// the model only called tools, as OpenAI reports it.
type assistant struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []llm.ToolCall `json:"tool_calls,omitempty"`
}

// record is a finished row decoded once and shared by every writer.
type record struct {
	row        store.Row
	plan       *conversation.Plan     // done and rejected rows
	answers    []llm.Result           // every stored answer, in turn order
	provs      []store.Provenance     // where each answer came from, in turn order
	res        llm.Result             // the last answer
	conv       []conversation.Message // the inputs and answers, ending with the last answer
	engineName func(string) string    // Options.EngineOf
	toks       *tokenSeq              // built by tokens() on first use
	turnRows   bool                   // Options.TokenRows is turn: rows() gives one record per answer
	specForge  bool                   // the SpecForge profile: ShareGPT rows are turns (rowIDs)
	// keepHistoryReasoning is Options.KeepHistoryReasoning.
	keepHistoryReasoning bool
	// conversationID and turn are set on a turn row (rows()): the sample
	// it belongs to, whose id row.ID no longer is, and its answer's index.
	conversationID string
	turn           int
}

func (r *record) truncated() bool { return r.res.FinishReason == "length" }

// sourceID is the part of the sample id that names the source row: ids are
// "<partition>/<key>", the key being the row's id field when the source
// maps one (so it joins back to the source) and otherwise a hash of the
// partition and the request content.
func (r *record) sourceID() string {
	return strings.TrimPrefix(cmp.Or(r.conversationID, r.row.ID), r.row.Partition+"/")
}

func (r *record) assistant() assistant {
	a := assistant{Role: "assistant", ReasoningContent: r.res.ReasoningContent, ToolCalls: r.res.ToolCalls}
	if r.res.Content != "" || len(r.res.ToolCalls) == 0 {
		c := r.res.Content
		a.Content = &c
	}
	return a
}

// decodeRecord parses the body and every answer of a done or rejected row
// and puts the conversation together; dead rows need neither.
func decodeRecord(row store.Row) (*record, error) {
	rec := &record{row: row}
	if row.State != store.Done && row.State != store.Rejected {
		return rec, nil
	}
	p, err := conversation.Decode(row.Body)
	if err != nil {
		return nil, fmt.Errorf("sample %s: %w", row.ID, err)
	}
	rec.plan = p
	for _, prior := range row.Prior {
		a, err := reply.Decode(prior)
		if err != nil {
			return nil, fmt.Errorf("sample %s: decode stored answer to turn %d: %w", row.ID, conversation.Ordinal(prior.Turn), err)
		}
		rec.answers, rec.provs = append(rec.answers, a.Result), append(rec.provs, a.Provenance)
	}
	a, err := reply.Decode(row.Result)
	if err != nil {
		return nil, fmt.Errorf("sample %s: decode stored result: %w", row.ID, err)
	}
	rec.res = a.Result
	rec.answers, rec.provs = append(rec.answers, a.Result), append(rec.provs, a.Provenance)
	if rec.conv, err = p.Conversation(rec.answers); err != nil {
		return nil, fmt.Errorf("sample %s: %w", row.ID, err)
	}
	return rec, nil
}

// last is the last answer's provenance.
func (r *record) last() store.Provenance { return r.provs[len(r.provs)-1] }

// lineEncoder writes one JSON value per line without HTML escaping
// (prompts are full of <, > and &).
type lineEncoder struct{ enc *json.Encoder }

func newLineEncoder(a *atomicFile) lineEncoder {
	e := json.NewEncoder(a)
	e.SetEscapeHTML(false)
	return lineEncoder{e}
}

func (l lineEncoder) write(v any) error { return l.enc.Encode(v) } // Encode appends the newline
