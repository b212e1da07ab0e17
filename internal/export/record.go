package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// message is one input chat message as the source wrote it into the
// sample body; content stays raw (a string, a list of parts or null).
type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Name       string          `json:"name,omitempty"`
}

// request is the canonical sample body.
type request struct {
	Messages []message       `json:"messages"`
	Tools    json.RawMessage `json:"tools,omitempty"`
}

// assistant is the generated turn. Content is null when the model only
// called tools, as OpenAI reports it.
type assistant struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []llm.ToolCall `json:"tool_calls,omitempty"`
}

// record is a finished row decoded once and shared by every writer.
type record struct {
	row store.Row
	req request    // done rows only
	res llm.Result // done rows only
}

func (r *record) truncated() bool { return r.res.FinishReason == "length" }

// sourceID is the part of the sample id that names the source row: ids are
// "<partition>/<key>", the key being the row's id field when the source
// maps one (so it joins back to the source) and otherwise a hash of the
// partition and the request content.
func (r *record) sourceID() string { return strings.TrimPrefix(r.row.ID, r.row.Partition+"/") }

func (r *record) assistant() assistant {
	a := assistant{Role: "assistant", ReasoningContent: r.res.ReasoningContent, ToolCalls: r.res.ToolCalls}
	if r.res.Content != "" || len(r.res.ToolCalls) == 0 {
		c := r.res.Content
		a.Content = &c
	}
	return a
}

// decodeRecord parses a done row's body and result; other rows need neither.
func decodeRecord(row store.Row) (*record, error) {
	rec := &record{row: row}
	if row.State != store.Done {
		return rec, nil
	}
	if err := json.Unmarshal(row.Body, &rec.req); err != nil {
		return nil, fmt.Errorf("sample %s: decode request body: %w", row.ID, err)
	}
	if bytes.Equal(bytes.TrimSpace(rec.req.Tools), []byte("null")) {
		rec.req.Tools = nil
	}
	if err := json.Unmarshal(row.Result.Response, &rec.res); err != nil {
		return nil, fmt.Errorf("sample %s: decode stored result: %w", row.ID, err)
	}
	// The store's columns are authoritative where the response record is silent.
	if rec.res.FinishReason == "" {
		rec.res.FinishReason = row.Result.FinishReason
	}
	if rec.res.Usage.PromptTokens == 0 && rec.res.Usage.CompletionTokens == 0 {
		rec.res.Usage.PromptTokens = row.Result.PromptTokens
		rec.res.Usage.CompletionTokens = row.Result.CompletionTokens
		rec.res.Usage.TotalTokens = row.Result.PromptTokens + row.Result.CompletionTokens
	}
	return rec, nil
}

// lineEncoder writes one JSON value per line without HTML escaping
// (prompts are full of <, > and &).
type lineEncoder struct{ enc *json.Encoder }

func newLineEncoder(a *atomicFile) lineEncoder {
	e := json.NewEncoder(a)
	e.SetEscapeHTML(false)
	return lineEncoder{e}
}

func (l lineEncoder) write(v any) error { return l.enc.Encode(v) } // Encode appends the newline
