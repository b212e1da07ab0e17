package export

import (
	"encoding/json"
	"fmt"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// ParquetRow is one done sample in the Parquet export, in the layout of
// the ShareGPT line: Conversations is the whole conversation (every input
// turn and every regenerated answer, the last one included), Tools the
// tool list as JSON text ("[]" when none); the other columns stand beside
// them. Endpoint, Seed and the provenance columns are set only with full
// metadata.
type ParquetRow struct {
	ID            string           `parquet:"id"`
	SourceID      string           `parquet:"source_id"`
	Conversations []ParquetMessage `parquet:"conversations,list"`
	Tools         string           `parquet:"tools"`
	Partition     string           `parquet:"partition"`
	Truncated     bool             `parquet:"truncated"`
	// ChatTemplateKwargs: as the ShareGPT line's (templateKwargs).
	ChatTemplateKwargs *string `parquet:"chat_template_kwargs,optional"`
	Lane               string  `parquet:"lane"`
	FinishReason       string  `parquet:"finish_reason"`
	PromptTokens       int64   `parquet:"prompt_tokens"`
	CompletionTokens   int64   `parquet:"completion_tokens"`
	Endpoint           *string `parquet:"endpoint,optional"`
	Seed               *int64  `parquet:"seed,optional"` // with full metadata, when one was sent
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

// ParquetMessage is one message, with the ShareGPT line's fields: content
// the text ("" beside tool calls, content parts as their text), the others
// null when the message has none.
type ParquetMessage struct {
	Role             string            `parquet:"role"`
	Content          string            `parquet:"content"`
	ReasoningContent *string           `parquet:"reasoning_content,optional"`
	ToolCalls        []ParquetToolCall `parquet:"tool_calls,optional,list"`
	ToolCallID       *string           `parquet:"tool_call_id,optional"`
	Name             *string           `parquet:"name,optional"`
}

// ParquetToolCall is an OpenAI tool call, arguments as JSON text.
type ParquetToolCall struct {
	ID       string `parquet:"id"`
	Type     string `parquet:"type"`
	Function struct {
		Name      string `parquet:"name"`
		Arguments string `parquet:"arguments"`
	} `parquet:"function"`
}

// ParquetTokenRow is a ParquetRow with the conversation's token ids, the
// schema of <name>.parquet when output.token_ids is on: InputIDs and
// LossMask as the ShareGPT line has them, on every row (the rows without
// are in <name>.no-token-ids.parquet); TokenIDs stays null.
type ParquetTokenRow struct {
	ParquetRow
	InputIDs []int32 `parquet:"input_ids,list"`
	LossMask []int8  `parquet:"loss_mask,list"`
	TokenIDs *string `parquet:"token_ids,optional"`
}

// ParquetNoIDsRow is a ParquetRow without token ids and the reason why, the
// schema of <name>.no-token-ids.parquet when output.token_ids is on: the
// Parquet file, like the ShareGPT one, is all-ids or no-ids.
type ParquetNoIDsRow struct {
	ParquetRow
	TokenIDs *string `parquet:"token_ids,optional"`
}

// ParquetTurnRow is one assistant turn's row, the schema of
// <name>.parquet with output.token_rows: turn: the conversation up to and
// including that turn's answer, the conversation (sample) it belongs to,
// the turn (from 1), and that turn's prompt ids then completion ids, loss
// on the completion alone. ID is "<sample id>/turn<k>".
type ParquetTurnRow struct {
	ParquetRow
	ConversationID string  `parquet:"conversation_id"`
	Turn           int64   `parquet:"turn"`
	InputIDs       []int32 `parquet:"input_ids,list"`
	LossMask       []int8  `parquet:"loss_mask,list"`
	TokenIDs       *string `parquet:"token_ids,optional"`
}

// ParquetTurnNoIDsRow is a turn row without token ids and the reason why,
// the schema of <name>.no-token-ids.parquet with output.token_rows: turn.
type ParquetTurnNoIDsRow struct {
	ParquetRow
	ConversationID string  `parquet:"conversation_id"`
	Turn           int64   `parquet:"turn"`
	TokenIDs       *string `parquet:"token_ids,optional"`
}

// rowGroupRows bounds the rows held in memory before a row group is flushed.
const rowGroupRows = 1024

// parquetSink writes the Parquet file; with token ids, rows whose ids are
// unavailable go to noIDs, a file of their own.
type parquetSink struct {
	out, noIDs, trunc          *output
	rows, noIDsRows, truncRows rowWriter
	full                       bool
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

type noIDsRows struct {
	*parquet.GenericWriter[ParquetNoIDsRow]
	buf []ParquetNoIDsRow
}

func (w *noIDsRows) write(r *record, row ParquetRow) error {
	w.buf[0] = ParquetNoIDsRow{ParquetRow: row, TokenIDs: optional(r.tokens().Missing)}
	_, err := w.Write(w.buf)
	return err
}

type turnRows struct {
	*parquet.GenericWriter[ParquetTurnRow]
	buf []ParquetTurnRow
}

func (w *turnRows) write(r *record, row ParquetRow) error {
	t := r.tokens()
	w.buf[0] = ParquetTurnRow{ParquetRow: row, ConversationID: r.conversationID, Turn: int64(r.turnFields().Turn),
		InputIDs: t.InputIDs, LossMask: t.LossMask, TokenIDs: optional(t.Missing)}
	_, err := w.Write(w.buf)
	return err
}

type turnNoIDsRows struct {
	*parquet.GenericWriter[ParquetTurnNoIDsRow]
	buf []ParquetTurnNoIDsRow
}

func (w *turnNoIDsRows) write(r *record, row ParquetRow) error {
	w.buf[0] = ParquetTurnNoIDsRow{ParquetRow: row, ConversationID: r.conversationID, Turn: int64(r.turnFields().Turn),
		TokenIDs: optional(r.tokens().Missing)}
	_, err := w.Write(w.buf)
	return err
}

// newParquet opens the Parquet file and its side files (sides); turns
// (output.token_rows: turn) writes turn rows in each.
func newParquet(create createFunc, path string, side sides, full, tokens, turns bool) (*parquetSink, error) {
	af, err := create(path)
	if err != nil {
		return nil, err
	}
	opts := []parquet.WriterOption{
		parquet.Compression(&zstd.Codec{}),
		parquet.MaxRowsPerRowGroup(rowGroupRows),
		parquet.CreatedBy("regen", "", ""),
	}
	s := &parquetSink{out: &output{format: FormatParquet, af: af}, full: full}
	// The training file's row type; the truncated file has the same one.
	rows := func(a *atomicFile) rowWriter {
		switch {
		case turns:
			return &turnRows{parquet.NewGenericWriter[ParquetTurnRow](a, opts...), make([]ParquetTurnRow, 1)}
		case tokens:
			return &tokenRows{parquet.NewGenericWriter[ParquetTokenRow](a, opts...), make([]ParquetTokenRow, 1)}
		}
		return &plainRows{parquet.NewGenericWriter[ParquetRow](a, opts...), make([]ParquetRow, 1)}
	}
	s.rows = rows(af)
	open := func(path, format string) (*output, error) {
		f, err := create(path)
		if err != nil {
			for _, o := range s.files() {
				o.af.abort()
			}
			return nil, err
		}
		return &output{format: format, af: f}, nil
	}
	if side.noIDs != "" {
		if s.noIDs, err = open(side.noIDs, FormatParquetNoTokenIDs); err != nil {
			return nil, err
		}
		if turns {
			s.noIDsRows = &turnNoIDsRows{parquet.NewGenericWriter[ParquetTurnNoIDsRow](s.noIDs.af, opts...), make([]ParquetTurnNoIDsRow, 1)}
		} else {
			s.noIDsRows = &noIDsRows{parquet.NewGenericWriter[ParquetNoIDsRow](s.noIDs.af, opts...), make([]ParquetNoIDsRow, 1)}
		}
	}
	if side.truncated != "" {
		if s.trunc, err = open(side.truncated, FormatParquetTruncated); err != nil {
			return nil, err
		}
		s.truncRows = rows(s.trunc.af)
	}
	return s, nil
}

func (s *parquetSink) files() []*output {
	out := []*output{s.out}
	for _, o := range []*output{s.noIDs, s.trunc} {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// write writes a done sample's rows; Parquet keeps the layout both
// trainers read under every profile (SpecForge reads no Parquet).
func (s *parquetSink) write(r *record) error { return writeTrainingRows(r, r.turnRows, s.writeRow) }

// writeRow writes one training row: a conversation, or one turn of it.
func (s *parquetSink) writeRow(r *record) error {
	row := parquetRow(r)
	if s.full {
		row.Endpoint = optional(r.row.Result.Endpoint)
		row.Seed = r.plan.Seed
		p := r.last()
		gen := int64(p.Generation)
		row.Generation = &gen
		row.Model, row.Engine, row.EngineVersion = optional(p.Model), optional(p.Engine), optional(p.EngineVersion)
		row.SystemFingerprint, row.Sampling = optional(p.SystemFingerprint), optional(string(p.Sampling))
	}
	out, rows := s.out, s.rows
	if s.noIDs != nil && r.tokens().Missing != "" {
		out, rows = s.noIDs, s.noIDsRows
	}
	if s.trunc != nil && r.truncated() {
		out, rows = s.trunc, s.truncRows
	}
	if err := rows.write(r, row); err != nil {
		return fmt.Errorf("parquet sample %s: %w", r.row.ID, err)
	}
	out.rows++
	if out.rows%rowGroupRows == 0 {
		if err := rows.Flush(); err != nil {
			return fmt.Errorf("parquet flush: %w", err)
		}
	}
	return nil
}

// close writes the footers; the atomic files are synced by the caller.
func (s *parquetSink) close() error {
	if err := s.rows.Close(); err != nil {
		return fmt.Errorf("parquet close: %w", err)
	}
	if s.noIDsRows != nil {
		if err := s.noIDsRows.Close(); err != nil {
			return fmt.Errorf("parquet close %s: %w", FormatParquetNoTokenIDs, err)
		}
	}
	if s.truncRows != nil {
		if err := s.truncRows.Close(); err != nil {
			return fmt.Errorf("parquet close %s: %w", FormatParquetTruncated, err)
		}
	}
	return nil
}

func parquetRow(r *record) ParquetRow {
	row := ParquetRow{
		ID:                 r.row.ID,
		SourceID:           r.sourceID(),
		Conversations:      make([]ParquetMessage, len(r.conv)),
		Tools:              toolsText(r.plan.Tools),
		Partition:          r.row.Partition,
		Truncated:          r.truncated(),
		ChatTemplateKwargs: templateKwargs(r.last()),
		Lane:               r.row.Lane,
		FinishReason:       r.res.FinishReason,
		PromptTokens:       int64(r.res.Usage.PromptTokens),
		CompletionTokens:   int64(r.res.Usage.CompletionTokens),
	}
	// The same messages as the ShareGPT line, so both files agree.
	for i, m := range sharegptMessages(r.conv) {
		pm := ParquetMessage{Role: m.Role, Content: m.Content, ReasoningContent: m.ReasoningContent, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			var pc ParquetToolCall
			pc.ID, pc.Type, pc.Function.Name, pc.Function.Arguments = c.ID, c.Type, c.Function.Name, c.Function.Arguments
			pm.ToolCalls = append(pm.ToolCalls, pc)
		}
		row.Conversations[i] = pm
	}
	return row
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
