package export

import (
	"encoding/json"
	"fmt"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"

	"github.com/regen-dev/regen/internal/store"
)

// ParquetRow is one done sample in the Parquet export. Messages are the
// conversation before the last answer (earlier answers of a multi-turn
// sample included); the last answer is in Completion, ReasoningContent and
// ToolCalls. Endpoint is set only with full metadata.
type ParquetRow struct {
	ID               string           `parquet:"id"`
	SourceID         string           `parquet:"source_id"`
	Partition        string           `parquet:"partition"`
	Lane             string           `parquet:"lane"`
	Messages         []ParquetMessage `parquet:"messages,list"`
	Tools            *string          `parquet:"tools,optional"` // JSON array, null when none
	Completion       string           `parquet:"completion"`
	ReasoningContent *string          `parquet:"reasoning_content,optional"`
	ToolCalls        *string          `parquet:"tool_calls,optional"` // JSON array, null when none
	FinishReason     string           `parquet:"finish_reason"`
	PromptTokens     int64            `parquet:"prompt_tokens"`
	CompletionTokens int64            `parquet:"completion_tokens"`
	Endpoint         *string          `parquet:"endpoint,optional"`
	Seed             *int64           `parquet:"seed,optional"` // with full metadata, when one was sent
	// The last answer's provenance, with full metadata: configuration
	// generation, the model id it named, the server's engine, version and
	// system_fingerprint when it said, the sampling parameters sent (JSON).
	Generation        *int64  `parquet:"generation,optional"`
	Model             *string `parquet:"model,optional"`
	Engine            *string `parquet:"engine,optional"`
	EngineVersion     *string `parquet:"engine_version,optional"`
	SystemFingerprint *string `parquet:"system_fingerprint,optional"`
	Sampling          *string `parquet:"sampling,optional"`
}

// ParquetMessage is one input turn. Content is the text, or the JSON of a
// list of content parts; null when the message had none.
type ParquetMessage struct {
	Role       string  `parquet:"role"`
	Content    *string `parquet:"content,optional"`
	ToolCalls  *string `parquet:"tool_calls,optional"` // JSON array
	ToolCallID *string `parquet:"tool_call_id,optional"`
	Name       *string `parquet:"name,optional"`
	// ReasoningContent is an earlier answer's thinking.
	ReasoningContent *string `parquet:"reasoning_content,optional"`
}

// ParquetTokenRow is a ParquetRow with the conversation's token ids, the
// schema of the export when output.token_ids is on: InputIDs and LossMask
// as the ShareGPT line has them (empty lists when unavailable), TokenIDs
// the reason when they are unavailable.
type ParquetTokenRow struct {
	ParquetRow
	InputIDs []int32 `parquet:"input_ids,list"`
	LossMask []int8  `parquet:"loss_mask,list"`
	TokenIDs *string `parquet:"token_ids,optional"`
}

// rowGroupRows bounds the rows held in memory before a row group is flushed.
const rowGroupRows = 1024

type parquetSink struct {
	out  *output
	rows rowWriter
	full bool
}

// rowWriter writes one row type: ParquetRow, or ParquetTokenRow with token ids.
type rowWriter interface {
	write(r *record, row ParquetRow) error
	Flush() error
	Close() error
}

type plainRows struct {
	*parquet.GenericWriter[ParquetRow]
	buf []ParquetRow
}

func (w *plainRows) write(_ *record, row ParquetRow) error {
	w.buf[0] = row
	_, err := w.Write(w.buf)
	return err
}

type tokenRows struct {
	*parquet.GenericWriter[ParquetTokenRow]
	buf []ParquetTokenRow
}

func (w *tokenRows) write(r *record, row ParquetRow) error {
	t := r.tokens()
	w.buf[0] = ParquetTokenRow{ParquetRow: row, InputIDs: t.InputIDs, LossMask: t.LossMask, TokenIDs: optional(t.Missing)}
	_, err := w.Write(w.buf)
	return err
}

func newParquet(create createFunc, path string, full, tokens bool) (*parquetSink, error) {
	af, err := create(path)
	if err != nil {
		return nil, err
	}
	opts := []parquet.WriterOption{
		parquet.Compression(&zstd.Codec{}),
		parquet.MaxRowsPerRowGroup(rowGroupRows),
		parquet.CreatedBy("regen", "", ""),
	}
	var rows rowWriter = &plainRows{parquet.NewGenericWriter[ParquetRow](af, opts...), make([]ParquetRow, 1)}
	if tokens {
		rows = &tokenRows{parquet.NewGenericWriter[ParquetTokenRow](af, opts...), make([]ParquetTokenRow, 1)}
	}
	return &parquetSink{out: &output{format: FormatParquet, af: af}, rows: rows, full: full}, nil
}

func (s *parquetSink) files() []*output { return []*output{s.out} }

func (s *parquetSink) write(r *record) error {
	if r.row.State != store.Done {
		return nil
	}
	row, err := parquetRow(r)
	if err != nil {
		return err
	}
	if s.full {
		row.Endpoint = optional(r.row.Result.Endpoint)
		row.Seed = r.plan.Seed
		p := r.last()
		gen := int64(p.Generation)
		row.Generation = &gen
		row.Model, row.Engine, row.EngineVersion = optional(p.Model), optional(p.Engine), optional(p.EngineVersion)
		row.SystemFingerprint, row.Sampling = optional(p.SystemFingerprint), optional(string(p.Sampling))
	}
	if err := s.rows.write(r, row); err != nil {
		return fmt.Errorf("parquet sample %s: %w", r.row.ID, err)
	}
	s.out.rows++
	if s.out.rows%rowGroupRows == 0 {
		if err := s.rows.Flush(); err != nil {
			return fmt.Errorf("parquet flush: %w", err)
		}
	}
	return nil
}

// close writes the footer; the atomic file is synced by the caller.
func (s *parquetSink) close() error {
	if err := s.rows.Close(); err != nil {
		return fmt.Errorf("parquet close: %w", err)
	}
	return nil
}

func parquetRow(r *record) (ParquetRow, error) {
	row := ParquetRow{
		ID:               r.row.ID,
		SourceID:         r.sourceID(),
		Partition:        r.row.Partition,
		Lane:             r.row.Lane,
		Messages:         make([]ParquetMessage, 0, len(r.conv)-1),
		Tools:            rawText(r.plan.Tools),
		Completion:       r.res.Content,
		ReasoningContent: optional(r.res.ReasoningContent),
		FinishReason:     r.res.FinishReason,
		PromptTokens:     int64(r.res.Usage.PromptTokens),
		CompletionTokens: int64(r.res.Usage.CompletionTokens),
	}
	if len(r.res.ToolCalls) > 0 {
		b, err := json.Marshal(r.res.ToolCalls)
		if err != nil {
			return row, fmt.Errorf("parquet sample %s: tool calls: %w", r.row.ID, err)
		}
		row.ToolCalls = optional(string(b))
	}
	for _, m := range r.conv[:len(r.conv)-1] {
		pm := ParquetMessage{
			Role:             m.Role,
			ToolCalls:        rawText(m.ToolCalls),
			ToolCallID:       optional(m.ToolCallID),
			Name:             optional(m.Name),
			ReasoningContent: optional(m.ReasoningContent),
		}
		var text string
		switch {
		case rawText(m.Content) == nil:
		case json.Unmarshal(m.Content, &text) == nil:
			pm.Content = &text
		default:
			pm.Content = rawText(m.Content) // content parts stay JSON
		}
		row.Messages = append(row.Messages, pm)
	}
	return row, nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// rawText keeps a JSON value as text; absent and null become null.
func rawText(b json.RawMessage) *string {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	s := string(b)
	return &s
}
