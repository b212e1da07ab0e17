package source

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/regen-dev/regen/internal/job"
)

// shareGPTRoles maps the ShareGPT `from` values regen accepts to OpenAI
// roles. function_call becomes an assistant turn whose content is the call
// text, and observation-like turns become tool messages, so the prompt keeps
// the tool round trip the dataset recorded.
var shareGPTRoles = map[string]string{
	"human":             "user",
	"user":              "user",
	"gpt":               "assistant",
	"assistant":         "assistant",
	"chatgpt":           "assistant",
	"bard":              "assistant",
	"bing":              "assistant",
	"model":             "assistant",
	"system":            "system",
	"function_call":     "assistant",
	"observation":       "tool",
	"function_response": "tool",
	"tool":              "tool",
	"ipython":           "tool",
}

// openAIRoles are the roles accepted in a `messages` field.
var openAIRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
}

// message is one canonical chat message; field order fixes the JSON bytes.
type message struct {
	Role       string   `json:"role"`
	Content    any      `json:"content"`
	Name       string   `json:"name,omitempty"`
	ToolCalls  any      `json:"tool_calls,omitempty"`
	ToolCallID string   `json:"tool_call_id,omitempty"`
	at         turnPath // where the content came from, for errors
}

// turnPath names turn i of a list field (i < 0: the field itself); the
// string is built only when a row is bad, keeping good rows cheap.
type turnPath struct {
	field string
	i     int
	key   string
}

func (p turnPath) String() string {
	s := p.field
	if p.i >= 0 {
		s += "[" + strconv.Itoa(p.i) + "]"
	}
	if p.key != "" {
		s += "." + p.key
	}
	return s
}

// sub is the path of key inside turn p.
func (p turnPath) sub(key string) string { p.key = key; return p.String() }

// rowError is why one row cannot become a sample.
type rowError struct {
	field  string
	reason string
}

func (e *rowError) Error() string { return e.reason }

func fieldErr(field, format string, args ...any) *rowError {
	return &rowError{field: field, reason: "field " + field + ": " + fmt.Sprintf(format, args...)}
}

func wrongType(field, want string, got any) *rowError {
	return fieldErr(field, "want %s, got %s", want, jsonType(got))
}

// jsonType names a decoded value's JSON type for error messages.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string, []byte:
		return "string"
	case bool:
		return "boolean"
	case json.Number, float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// asString accepts string and []byte (Parquet BYTE_ARRAY without the STRING annotation).
func asString(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return s, true
	case []byte:
		return string(s), true
	}
	return "", false
}

// plain converts []byte leaves to strings so nested values marshal as text, not base64.
func plain(v any) any {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case []any:
		for i := range x {
			x[i] = plain(x[i])
		}
	case map[string]any:
		for k, e := range x {
			x[k] = plain(e)
		}
	}
	return v
}

// mapper turns decoded rows of one source into canonical samples.
type mapper struct {
	src job.Source
	buf bytes.Buffer
	enc *json.Encoder
}

func newMapper(src job.Source) *mapper {
	m := &mapper{src: src}
	m.enc = json.NewEncoder(&m.buf)
	m.enc.SetEscapeHTML(false) // prompts are full of <, > and &; keep them readable
	return m
}

// sample maps one row. The returned Sample's Body is a fresh slice the caller may keep.
func (m *mapper) sample(row map[string]any, origin string) (Sample, *rowError) {
	msgs, rerr := m.messages(row)
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

	m.buf.Reset()
	m.buf.WriteString(`{"messages":`)
	if err := m.enc.Encode(msgs); err != nil {
		return Sample{}, &rowError{reason: "encode messages: " + err.Error()}
	}
	m.buf.Truncate(m.buf.Len() - 1) // Encoder's newline
	toolsLen := 0
	if len(tools) > 0 {
		m.buf.WriteString(`,"tools":`)
		start := m.buf.Len()
		if err := m.enc.Encode(tools); err != nil {
			return Sample{}, &rowError{field: m.src.Tools, reason: "field " + m.src.Tools + ": encode tools: " + err.Error()}
		}
		m.buf.Truncate(m.buf.Len() - 1)
		toolsLen = m.buf.Len() - start
	}
	m.buf.WriteByte('}')
	body := bytes.Clone(m.buf.Bytes())

	if id == "" {
		h := sha256.New()
		io.WriteString(h, m.src.Partition)
		h.Write([]byte{0})
		h.Write(body)
		id = hex.EncodeToString(h.Sum(nil))[:32]
	}
	return Sample{
		ID:           m.src.Partition + "/" + id,
		Partition:    m.src.Partition,
		Body:         body,
		PromptTokens: estimateTokens(msgs, toolsLen),
		Origin:       origin,
	}, nil
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

// idValue formats the mapped id field: a non-empty string or a number.
func idValue(row map[string]any, field string) (string, *rowError) {
	v, ok := row[field]
	if !ok || v == nil {
		return "", fieldErr(field, "missing")
	}
	switch x := v.(type) {
	case string:
		if x == "" {
			return "", fieldErr(field, "empty id")
		}
		return x, nil
	case []byte:
		if len(x) == 0 {
			return "", fieldErr(field, "empty id")
		}
		return string(x), nil
	case json.Number:
		return x.String(), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case float32:
		return strconv.FormatFloat(float64(x), 'f', -1, 32), nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), nil
	}
	return "", wrongType(field, "string or number", v)
}

// messages builds the prompt: mapped turns, trailing assistant turns
// dropped, and the system prompt prepended when the row has none.
func (m *mapper) messages(row map[string]any) ([]message, *rowError) {
	var (
		msgs  []message
		field string
		rerr  *rowError
	)
	switch {
	case m.src.Conversations != "":
		field = m.src.Conversations
		msgs, rerr = shareGPT(row, field)
	case m.src.Messages != "":
		field = m.src.Messages
		msgs, rerr = openAI(row, field)
	case m.src.Prompt != "":
		field = m.src.Prompt
		v, ok := row[field]
		if !ok || v == nil {
			return nil, fieldErr(field, "missing")
		}
		s, ok := asString(v)
		if !ok {
			return nil, wrongType(field, "string", v)
		}
		msgs = []message{{Role: "user", Content: s, at: turnPath{field: field, i: -1}}}
	default:
		return nil, &rowError{reason: "source maps none of conversations, messages or prompt"}
	}
	if rerr != nil {
		return nil, rerr
	}

	// The final answer is what we regenerate, so the prompt ends at the last non-assistant turn.
	end := len(msgs)
	for end > 0 && msgs[end-1].Role == "assistant" {
		end--
	}
	msgs = msgs[:end]
	if len(msgs) == 0 || msgs[len(msgs)-1].Role == "system" {
		return nil, fieldErr(field, "empty conversation")
	}
	for _, msg := range msgs {
		if isEmpty(msg) {
			return nil, fieldErr(msg.at.String(), "empty content")
		}
	}

	sys := m.src.System
	if sys == "" && m.src.SystemField != "" {
		if v := row[m.src.SystemField]; v != nil {
			s, ok := asString(v)
			if !ok {
				return nil, wrongType(m.src.SystemField, "string", v)
			}
			sys = s
		}
	}
	if strings.TrimSpace(sys) != "" && msgs[0].Role != "system" {
		msgs = append([]message{{Role: "system", Content: sys}}, msgs...)
	}
	return msgs, nil
}

func isEmpty(msg message) bool {
	if msg.ToolCalls != nil {
		return false
	}
	switch c := msg.Content.(type) {
	case nil:
		return true
	case string:
		return strings.TrimSpace(c) == ""
	case []any:
		return len(c) == 0
	}
	return false
}

func listField(row map[string]any, field string) ([]any, *rowError) {
	v, ok := row[field]
	if !ok || v == nil {
		return nil, fieldErr(field, "missing")
	}
	list, ok := v.([]any)
	if !ok {
		return nil, wrongType(field, "array", v)
	}
	return list, nil
}

// shareGPT maps [{"from":..., "value":...}] turns; role/content keys are accepted too.
func shareGPT(row map[string]any, field string) ([]message, *rowError) {
	list, rerr := listField(row, field)
	if rerr != nil {
		return nil, rerr
	}
	msgs := make([]message, 0, len(list))
	for i, e := range list {
		at := turnPath{field: field, i: i}
		turn, ok := e.(map[string]any)
		if !ok {
			return nil, wrongType(at.String(), "object", e)
		}
		fromKey, valueKey := "from", "value"
		if _, ok := turn["from"]; !ok {
			if _, ok := turn["role"]; ok {
				fromKey, valueKey = "role", "content"
			}
		}
		fv, ok := turn[fromKey]
		if !ok || fv == nil {
			return nil, fieldErr(at.sub(fromKey), "missing")
		}
		from, ok := asString(fv)
		if !ok {
			return nil, wrongType(at.sub(fromKey), "string", fv)
		}
		role, ok := shareGPTRoles[strings.ToLower(from)]
		if !ok {
			return nil, fieldErr(at.sub(fromKey), "unknown role %q", from)
		}
		vv, ok := turn[valueKey]
		if !ok {
			return nil, fieldErr(at.sub(valueKey), "missing")
		}
		value, ok := asString(vv)
		if !ok {
			return nil, wrongType(at.sub(valueKey), "string", vv)
		}
		msgs = append(msgs, message{Role: role, Content: value, at: turnPath{field, i, valueKey}})
	}
	return msgs, nil
}

// openAI maps [{"role":..., "content":...}] messages, passing name,
// tool_calls and tool_call_id through.
func openAI(row map[string]any, field string) ([]message, *rowError) {
	list, rerr := listField(row, field)
	if rerr != nil {
		return nil, rerr
	}
	msgs := make([]message, 0, len(list))
	for i, e := range list {
		at := turnPath{field: field, i: i}
		obj, ok := e.(map[string]any)
		if !ok {
			return nil, wrongType(at.String(), "object", e)
		}
		rv, ok := obj["role"]
		if !ok || rv == nil {
			return nil, fieldErr(at.sub("role"), "missing")
		}
		role, ok := asString(rv)
		if !ok {
			return nil, wrongType(at.sub("role"), "string", rv)
		}
		if !openAIRoles[role] {
			return nil, fieldErr(at.sub("role"), "unknown role %q", role)
		}
		msg := message{Role: role, at: turnPath{field, i, "content"}}
		switch c := obj["content"].(type) {
		case nil:
		case string:
			msg.Content = c
		case []byte:
			msg.Content = string(c)
		case []any:
			msg.Content = plain(c) // content parts
		default:
			return nil, wrongType(at.sub("content"), "string, array or null", c)
		}
		if v := obj["name"]; v != nil {
			s, ok := asString(v)
			if !ok {
				return nil, wrongType(at.sub("name"), "string", v)
			}
			msg.Name = s
		}
		if v := obj["tool_call_id"]; v != nil {
			s, ok := asString(v)
			if !ok {
				return nil, wrongType(at.sub("tool_call_id"), "string", v)
			}
			msg.ToolCallID = s
		}
		if v := obj["tool_calls"]; v != nil {
			calls, ok := v.([]any)
			if !ok {
				return nil, wrongType(at.sub("tool_calls"), "array", v)
			}
			if len(calls) > 0 {
				msg.ToolCalls = plain(calls)
			}
		}
		msgs = append(msgs, msg)
	}
	return msgs, nil
}

// tools reads the mapped tools field: an array, or a string holding a JSON
// array or concatenated JSON objects (glaive style). Missing, null, "" and
// [] all mean no tools.
func (m *mapper) tools(row map[string]any) ([]any, *rowError) {
	field := m.src.Tools
	if field == "" {
		return nil, nil
	}
	var list []any
	switch v := row[field].(type) {
	case nil:
		return nil, nil
	case []any:
		list = v
	case string, []byte:
		s, _ := asString(v)
		var err error
		if list, err = parseToolsString(s); err != nil {
			return nil, fieldErr(field, "bad tools JSON: %v", err)
		}
	default:
		return nil, wrongType(field, "array or JSON string", v)
	}
	out := make([]any, 0, len(list))
	for i, e := range list {
		t, rerr := normalizeTool(e, fmt.Sprintf("%s[%d]", field, i))
		if rerr != nil {
			return nil, rerr
		}
		out = append(out, t)
	}
	return out, nil
}

func parseToolsString(s string) ([]any, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if s[0] == '[' {
		var list []any
		if err := dec.Decode(&list); err != nil {
			return nil, errors.New(malformed(err, int64(len(s))))
		}
		if dec.More() {
			return nil, fmt.Errorf("data after the array at byte %d", dec.InputOffset())
		}
		return list, nil
	}
	var list []any
	for {
		var v any
		err := dec.Decode(&v)
		if err == io.EOF {
			return list, nil
		}
		if err != nil {
			return nil, errors.New(malformed(err, int64(len(s))))
		}
		list = append(list, v)
	}
}

// normalizeTool returns an OpenAI tool object, wrapping a bare function schema.
func normalizeTool(e any, at string) (any, *rowError) {
	obj, ok := e.(map[string]any)
	if !ok {
		return nil, wrongType(at, "object", e)
	}
	plain(obj)
	if fn, ok := obj["function"].(map[string]any); ok {
		if name, _ := fn["name"].(string); name == "" {
			return nil, fieldErr(at+".function.name", "missing")
		}
		if _, ok := obj["type"]; !ok {
			obj["type"] = "function"
		}
		return obj, nil
	}
	if name, _ := obj["name"].(string); name != "" {
		return map[string]any{"type": "function", "function": obj}, nil
	}
	return nil, fieldErr(at, "want a tool object {type, function} or a function schema with name")
}
