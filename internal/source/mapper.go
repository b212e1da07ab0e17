package source

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
)

// message is one mapped chat message: content and tool calls as decoded
// from the row (the token estimate reads them), where they came from, and
// the calls parsed. wire turns it into the body's conversation.Message.
type message struct {
	Role       string
	Content    any
	Name       string
	ToolCalls  any
	ToolCallID string
	at         turnPath // where the content came from, for errors
	calls      []llm.ToolCall
}

// mapper turns decoded rows of one source into canonical samples.
type mapper struct {
	src job.Source
	enc *conversation.Encoder
	// The body of the row being mapped, reused from row to row: Encode
	// copies what it writes.
	msgs  []conversation.Message
	turns []conversation.Turn
	orig  [][]conversation.Message
}

func newMapper(src job.Source) *mapper {
	return &mapper{src: src, enc: conversation.NewEncoder()}
}

// sample maps one row. The returned Sample's Body is a fresh slice the caller may keep.
func (m *mapper) sample(row map[string]any, origin string) (Sample, *rowError) {
	msgs, turns, originals, rerr := m.messages(row)
	if rerr != nil {
		return Sample{}, rerr
	}
	tools, rerr := m.tools(row)
	if rerr != nil {
		return Sample{}, rerr
	}

	var id string
	if m.src.ID != "" {
		if id, rerr = idValue(row, m.src.ID); rerr != nil {
			return Sample{}, rerr
		}
	}
	b, rerr := m.body(msgs, tools, turns, originals)
	if rerr != nil {
		return Sample{}, rerr
	}
	// The dataset's answers (Original) are not in the key, so ids stay
	// those of the bodies stored before regen kept them.
	body, key := m.enc.Encode(&b)
	if id == "" {
		h := sha256.New()
		io.WriteString(h, m.src.Partition)
		h.Write([]byte{0})
		h.Write(key)
		id = hex.EncodeToString(h.Sum(nil))[:32]
	}
	return Sample{
		ID:           m.src.Partition + "/" + id,
		Partition:    m.src.Partition,
		Body:         body,
		PromptTokens: estimateTokens(msgs, len(b.Tools)),
		Origin:       origin,
	}, nil
}

// body is the row's conversation.Body: turn 0's input, the tools, the
// later turns and the dataset's answers.
func (m *mapper) body(msgs []message, tools []any, turns []turnInput, originals [][]message) (conversation.Body, *rowError) {
	var b conversation.Body
	var err error
	m.msgs, m.turns, m.orig = m.msgs[:0], m.turns[:0], m.orig[:0]
	if b.Messages, err = m.wire(msgs); err != nil {
		return b, &rowError{reason: "encode messages: " + err.Error()}
	}
	if len(tools) > 0 {
		if b.Tools, err = m.enc.Raw(tools); err != nil {
			return b, &rowError{field: m.src.Tools, reason: "field " + m.src.Tools + ": encode tools: " + err.Error()}
		}
	}
	for _, t := range turns {
		in, err := m.wire(t.msgs)
		if err != nil {
			return b, &rowError{reason: "encode turns: " + err.Error()}
		}
		m.turns = append(m.turns, conversation.Turn{Calls: t.calls, Input: in})
	}
	if len(m.turns) > 0 {
		b.Turns = m.turns
	}
	for _, o := range originals {
		run, err := m.wire(o)
		if err != nil {
			return b, &rowError{reason: "encode the dataset's answers: " + err.Error()}
		}
		m.orig = append(m.orig, run)
	}
	if len(m.orig) > 0 {
		b.Original = m.orig
	}
	return b, nil
}

// wire is msgs as the body holds them (in the mapper's reused buffer).
func (m *mapper) wire(msgs []message) ([]conversation.Message, error) {
	start := len(m.msgs)
	for _, msg := range msgs {
		w := conversation.Message{Role: msg.Role, Name: msg.Name, ToolCallID: msg.ToolCallID}
		var err error
		if msg.Content != nil {
			if w.Content, err = m.enc.Raw(msg.Content); err != nil {
				return nil, err
			}
		}
		if msg.ToolCalls != nil {
			if w.ToolCalls, err = m.enc.Raw(msg.ToolCalls); err != nil {
				return nil, err
			}
		}
		m.msgs = append(m.msgs, w)
	}
	return m.msgs[start:len(m.msgs):len(m.msgs)], nil
}

// estimateTokens is a cheap estimate (about 4 bytes per token plus 4 per
// message for the chat template's framing), used only to pick lanes.
func estimateTokens(msgs []message, toolsLen int) int {
	n := toolsLen
	for _, msg := range msgs {
		switch c := msg.Content.(type) {
		case string:
			n += len(c)
		case nil:
		default:
			b, _ := json.Marshal(c)
			n += len(b)
		}
		if msg.ToolCalls != nil {
			b, _ := json.Marshal(msg.ToolCalls)
			n += len(b)
		}
	}
	return n/4 + 4*len(msgs)
}
