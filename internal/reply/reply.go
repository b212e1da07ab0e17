// Package reply is the stored answer, a server's reply to one turn: the
// record dispatch writes into an answer's response column and export,
// review and the dashboard read back. It is the one definition of those
// bytes; readers go through Decode so a record written by an earlier
// release reads the same.
package reply

import (
	"encoding/json"
	"fmt"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/rawjson"
	"github.com/regen-dev/regen/internal/store"
)

// Version is the shape Encode writes. Version 0 (no "v" key) is what
// releases up to c2f7b29 wrote: the same keys without "v"; an answer from
// before provenance was kept has no "provenance" and one from before the
// endpoint was kept no "endpoint".
const Version = 1

// Record is one stored answer: the completion, the server that gave it and
// where it came from.
type Record struct {
	V int `json:"v"`
	llm.Result
	Endpoint   string           `json:"endpoint"`
	Provenance store.Provenance `json:"provenance"`
}

// Encode is the response column for res from the server at endpoint.
func Encode(res llm.Result, endpoint string, p store.Provenance) []byte {
	// Plain strings, ints, durations and valid JSON cannot fail to marshal.
	b, _ := json.Marshal(Record{V: Version, Result: res, Endpoint: endpoint, Provenance: p})
	return b
}

// Decode reads a stored answer. What the record is silent about (an older
// release's record) is taken from the store's columns, which are
// authoritative: finish reason, token counts, endpoint, generation, and
// the model the response named.
func Decode(r store.Result) (Record, error) {
	var rec Record
	if err := json.Unmarshal(r.Response, &rec); err != nil {
		return Record{}, err
	}
	if rec.V > Version {
		return Record{}, fmt.Errorf("stored answer version %d: this regen reads versions up to %d", rec.V, Version)
	}
	if rec.FinishReason == "" {
		rec.FinishReason = r.FinishReason
	}
	if rec.Usage.PromptTokens == 0 && rec.Usage.CompletionTokens == 0 {
		rec.Usage.PromptTokens, rec.Usage.CompletionTokens = r.PromptTokens, r.CompletionTokens
		rec.Usage.TotalTokens = r.PromptTokens + r.CompletionTokens
		if rec.Usage.ReasoningTokens == 0 {
			rec.Usage.ReasoningTokens = r.ReasoningTokens
		}
	}
	if rec.Endpoint == "" {
		rec.Endpoint = r.Endpoint
	}
	if rec.Provenance.Generation == 0 {
		rec.Provenance.Generation = r.Generation
	}
	if rec.Provenance.Model == "" {
		rec.Provenance.Model = rec.Model
	}
	return rec, nil
}

// Answers decodes every stored answer of a finished row, in turn order
// (Prior, then Result).
func Answers(row store.Row) ([]Record, error) {
	out := make([]Record, 0, len(row.Prior)+1)
	for _, r := range append(row.Prior[:len(row.Prior):len(row.Prior)], row.Result) {
		rec, err := Decode(r)
		if err != nil {
			return nil, fmt.Errorf("decode stored answer to turn %d: %w", r.Turn+1, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// DecodeHistory reads what a conversation's history needs of a stored
// answer: its content, reasoning and tool calls, as Decode reads them. It
// walks the record (package rawjson) and decodes only those: the rest,
// token ids above all (each earlier answer holds the ids of its whole
// prompt), is checked, not decoded, so building a turn's request does not
// cost the runner more per turn than the history's bytes.
func DecodeHistory(r store.Result) (llm.Result, error) {
	return decodeHistory(r, false)
}

// DecodeHistoryQuoted is DecodeHistory that gives the content as the
// request quotes it (llm.Result.ContentJSON, Content left empty), copied
// from the record rather than decoded and quoted again, when the record
// allows: for a turn's request built from the store, which reads nothing
// else of the content.
func DecodeHistoryQuoted(r store.Result) (llm.Result, error) {
	return decodeHistory(r, true)
}

func decodeHistory(r store.Result, quoted bool) (llm.Result, error) {
	var res llm.Result
	v := 0
	err := rawjson.Object(r.Response, func(m rawjson.Member) error {
		if string(m.Value) == "null" {
			return nil
		}
		var err error
		switch m.Key {
		case "v":
			err = json.Unmarshal(m.Value, &v)
		case "content":
			if q, ok := appendQuoted(quoted, m.Value); ok {
				res.ContentJSON = q
			} else {
				res.Content, err = m.Text()
			}
		case "reasoning_content":
			res.ReasoningContent, err = m.Text()
		case "tool_calls":
			err = json.Unmarshal(m.Value, &res.ToolCalls)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", m.Key, err)
		}
		return nil
	})
	if err != nil {
		return llm.Result{}, err
	}
	if v > Version {
		return llm.Result{}, fmt.Errorf("stored answer version %d: this regen reads versions up to %d", v, Version)
	}
	return res, nil
}

// appendQuoted is rawjson.AppendQuoted of a content string when quoted.
func appendQuoted(quoted bool, value []byte) ([]byte, bool) {
	if !quoted {
		return nil, false
	}
	return rawjson.AppendQuoted(make([]byte, 0, len(value)), value)
}
