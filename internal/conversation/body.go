package conversation

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/regen-dev/regen/internal/llm"
)

// Message is one chat message. Content keeps the source's JSON (a string,
// a list of content parts, or null); ToolCalls keeps it too, except in the
// answers this package builds from results.
type Message struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             string          `json:"name,omitempty"`
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID       string          `json:"tool_call_id,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
}

// Turn is a turn after the first: the messages before its answer, and the
// tool calls the dataset recorded for the previous answer when Input holds
// their results.
type Turn struct {
	Calls []llm.ToolCall `json:"calls,omitempty"`
	Input []Message      `json:"input"`
}

// Body is a sample's canonical content, the bytes a source writes into the
// store and Decode reads back. Fields are in the order Encode writes them.
type Body struct {
	Messages []Message       `json:"messages"`
	Tools    json.RawMessage `json:"tools,omitempty"`
	Turns    []Turn          `json:"turns,omitempty"`
	// Original holds the dataset's own answer to each turn (its run of
	// assistant messages), kept for review beside the model's; never sent.
	Original [][]Message `json:"original,omitempty"`
	// Seed is the sampling seed sent with every turn's request: one of the
	// samples_per_prompt answers to one prompt (absent = none sent).
	Seed *int64 `json:"seed,omitempty"`
}

// Encoder writes bodies. It reuses one buffer, so one goroutine owns it.
//
// The bytes are a contract: a sample id is a hash of them, so for a given
// Body they never change. Writing cannot fail: every field is a string,
// a number or raw JSON. Keys come in Body's field order; messages is
// always written, every other key only when non-empty; strings are
// escaped as encoding/json does without HTML escaping (prompts are full of
// <, > and &); raw JSON fields (content, tool_calls, tools) are written as
// they are, so they must hold valid, compact JSON (what encoding/json or
// Decode gives); a message's content is null when it has none; a recorded
// tool call's (Turn.Calls) id is written even when empty.
type Encoder struct {
	buf   bytes.Buffer
	str   *json.Encoder // writes escaped strings and Raw values into buf
	arena []byte        // Raw's results, until Encode returns
}

// NewEncoder returns an Encoder.
func NewEncoder() *Encoder {
	e := &Encoder{}
	e.str = json.NewEncoder(&e.buf)
	e.str.SetEscapeHTML(false)
	return e
}

// Encode returns b's bytes and its key: the bytes of b without Original
// and Seed, which a sample id without an id field hashes (ids were made
// before regen kept the dataset's answers or seeded copies, and must not
// change). Both are fresh slices; key is body when b has neither.
func (e *Encoder) Encode(b *Body) (body, key []byte) {
	defer func() { e.arena = e.arena[:0] }()
	e.buf.Reset()
	e.buf.WriteString(`{"messages":`)
	e.messages(b.Messages)
	if len(b.Tools) > 0 {
		e.buf.WriteString(`,"tools":`)
		e.buf.Write(b.Tools)
	}
	if len(b.Turns) > 0 {
		e.buf.WriteString(`,"turns":[`)
		for i := range b.Turns {
			e.turn(i, &b.Turns[i])
		}
		e.buf.WriteByte(']')
	}
	e.buf.WriteByte('}')
	key = bytes.Clone(e.buf.Bytes())
	if len(b.Original) == 0 && b.Seed == nil {
		return key, key
	}
	e.buf.Truncate(e.buf.Len() - 1)
	if len(b.Original) > 0 {
		e.buf.WriteString(`,"original":[`)
		for i, run := range b.Original {
			if i > 0 {
				e.buf.WriteByte(',')
			}
			e.messages(run)
		}
		e.buf.WriteByte(']')
	}
	e.buf.WriteByte('}')
	body = e.buf.Bytes()
	if b.Seed != nil {
		return WithSeed(body, *b.Seed), key
	}
	return bytes.Clone(body), key
}

// WithSeed returns a copy of body (as Encode wrote it, without a seed)
// with seed added: the bytes Encode writes for that body with Seed set.
func WithSeed(body []byte, seed int64) []byte {
	out := make([]byte, 0, len(body)+28)
	out = append(out, body[:len(body)-1]...) // the closing brace
	out = append(out, `,"seed":`...)
	out = strconv.AppendInt(out, seed, 10)
	return append(out, '}')
}

func (e *Encoder) turn(i int, t *Turn) {
	if i > 0 {
		e.buf.WriteByte(',')
	}
	e.buf.WriteByte('{')
	if len(t.Calls) > 0 {
		e.buf.WriteString(`"calls":[`)
		for j := range t.Calls {
			e.call(j, &t.Calls[j])
		}
		e.buf.WriteString(`],`)
	}
	e.buf.WriteString(`"input":`)
	e.messages(t.Input)
	e.buf.WriteByte('}')
}

// call writes a recorded call with its id even when empty (llm.ToolCall
// alone would omit it), as bodies always had it.
func (e *Encoder) call(j int, c *llm.ToolCall) {
	if j > 0 {
		e.buf.WriteByte(',')
	}
	e.buf.WriteString(`{"id":`)
	e.string(c.ID)
	e.buf.WriteString(`,"type":`)
	e.string(c.Type)
	e.buf.WriteString(`,"function":{"name":`)
	e.string(c.Function.Name)
	e.buf.WriteString(`,"arguments":`)
	e.string(c.Function.Arguments)
	e.buf.WriteString(`}}`)
}

func (e *Encoder) messages(msgs []Message) {
	if msgs == nil {
		e.buf.WriteString("null")
		return
	}
	e.buf.WriteByte('[')
	for i := range msgs {
		if i > 0 {
			e.buf.WriteByte(',')
		}
		e.message(&msgs[i])
	}
	e.buf.WriteByte(']')
}

func (e *Encoder) message(m *Message) {
	e.buf.WriteString(`{"role":`)
	e.string(m.Role)
	e.buf.WriteString(`,"content":`)
	if m.Content == nil {
		e.buf.WriteString("null")
	} else {
		e.buf.Write(m.Content)
	}
	if m.Name != "" {
		e.buf.WriteString(`,"name":`)
		e.string(m.Name)
	}
	if len(m.ToolCalls) > 0 {
		e.buf.WriteString(`,"tool_calls":`)
		e.buf.Write(m.ToolCalls)
	}
	if m.ToolCallID != "" {
		e.buf.WriteString(`,"tool_call_id":`)
		e.string(m.ToolCallID)
	}
	if m.ReasoningContent != "" {
		e.buf.WriteString(`,"reasoning_content":`)
		e.string(m.ReasoningContent)
	}
	e.buf.WriteByte('}')
}

// string writes s as a JSON string; plain ASCII without escapes (roles,
// ids) skips the encoder.
func (e *Encoder) string(s string) {
	if plainASCII(s) {
		e.buf.WriteByte('"')
		e.buf.WriteString(s)
		e.buf.WriteByte('"')
		return
	}
	e.value(s) // a string always encodes
}

// Raw returns v as the JSON a raw field (content, tool_calls, tools)
// holds: encoding/json's bytes without HTML escaping. It is for building
// the Body this Encoder writes next: the bytes are the Encoder's and stay
// valid only until Encode returns (rows are mapped without an allocation
// per message).
func (e *Encoder) Raw(v any) (json.RawMessage, error) {
	e.buf.Reset()
	if err := e.value(v); err != nil {
		return nil, err
	}
	start := len(e.arena)
	e.arena = append(e.arena, e.buf.Bytes()...)
	return e.arena[start:len(e.arena):len(e.arena)], nil
}

// value appends v's JSON without the Encoder's newline.
func (e *Encoder) value(v any) error {
	if err := e.str.Encode(v); err != nil {
		return err
	}
	e.buf.Truncate(e.buf.Len() - 1)
	return nil
}

func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// Encode returns b's bytes (see Encoder).
func Encode(b *Body) []byte {
	body, _ := NewEncoder().Encode(b)
	return body
}
