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

	"github.com/regen-dev/regen/internal/conversation"
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
	calls      []conversation.ToolCall
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
	enc *conversation.Encoder
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
	body, key, err := m.enc.Encode(&b)
	if err != nil {
		return Sample{}, &rowError{reason: "encode body: " + err.Error()}
	}
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
		b.Turns = append(b.Turns, conversation.Turn{Calls: t.calls, Input: in})
	}
	for _, o := range originals {
		run, err := m.wire(o)
		if err != nil {
			return b, &rowError{reason: "encode the dataset's answers: " + err.Error()}
		}
		b.Original = append(b.Original, run)
	}
	return b, nil
}

// wire is msgs as the body holds them.
func (m *mapper) wire(msgs []message) ([]conversation.Message, error) {
	out := make([]conversation.Message, len(msgs))
	for i, msg := range msgs {
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
		out[i] = w
	}
	return out, nil
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

// messages maps the row's turns and splits them by the source's
// regeneration mode into turn 0's input and the later turns (none for a
// single turn). The system prompt is prepended when the row has none.
func (m *mapper) messages(row map[string]any) ([]message, []turnInput, [][]message, *rowError) {
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
			return nil, nil, nil, fieldErr(field, "missing")
		}
		s, ok := asString(v)
		if !ok {
			return nil, nil, nil, wrongType(field, "string", v)
		}
		msgs = []message{{Role: "user", Content: s, at: turnPath{field: field, i: -1}}}
	default:
		return nil, nil, nil, &rowError{reason: "source maps none of conversations, messages or prompt"}
	}
	if rerr != nil {
		return nil, nil, nil, rerr
	}

	sys := m.src.System
	if sys == "" && m.src.SystemField != "" {
		if v := row[m.src.SystemField]; v != nil {
			s, ok := asString(v)
			if !ok {
				return nil, nil, nil, wrongType(m.src.SystemField, "string", v)
			}
			sys = s
		}
	}
	sys = m.stripSystemPrefix(sys)
	if len(msgs) > 0 && msgs[0].Role == "system" {
		if s, ok := msgs[0].Content.(string); ok {
			msgs[0].Content = m.stripSystemPrefix(s)
		}
	}
	if strings.TrimSpace(sys) != "" && (len(msgs) == 0 || msgs[0].Role != "system") {
		msgs = append([]message{{Role: "system", Content: sys}}, msgs...)
	}

	var inputs []turnInput
	var originals [][]message
	if m.src.Regenerate == job.RegenerateLast {
		// Only the final answer is regenerated: the prompt is everything up
		// to the last non-assistant turn, history as the dataset wrote it.
		end := len(msgs)
		for end > 0 && msgs[end-1].Role == "assistant" {
			end--
		}
		inputs = []turnInput{{msgs: msgs[:end]}}
		if end < len(msgs) {
			originals = [][]message{msgs[end:]}
		}
	} else {
		inputs, originals = splitTurns(msgs)
	}
	first := inputs[0].msgs
	if len(first) == 0 || !asksForAnswer(first[len(first)-1].Role) {
		return nil, nil, nil, fieldErr(field, "empty conversation")
	}
	for _, in := range inputs {
		for _, msg := range in.msgs {
			if isEmpty(msg) {
				return nil, nil, nil, fieldErr(msg.at.String(), "empty content")
			}
		}
	}
	turns := make([]turnInput, 0, len(inputs)-1)
	for _, in := range inputs[1:] {
		t := turnInput{msgs: in.msgs}
		if in.msgs[0].Role == "tool" {
			if len(in.calls) == 0 {
				return nil, nil, nil, fieldErr(in.msgs[0].at.String(), "tool result after an answer that called no tool")
			}
			t.calls = in.calls
		}
		turns = append(turns, t)
	}
	return first, turns, originals, nil
}

// asksForAnswer reports whether a message with role can end a prompt.
func asksForAnswer(role string) bool {
	return role != "system" && role != "developer" && role != "assistant"
}

// turnInput is the input of one turn and the tool calls recorded in the
// answer before it (only when the input starts with their results).
type turnInput struct {
	msgs  []message
	calls []conversation.ToolCall
}

// splitTurns cuts a conversation at every answer the job regenerates: each
// run of assistant messages after the first user message. It returns the
// input of every turn: the messages before the first answer, then those
// between answers, then, when the conversation ends with a user or tool
// message, the messages after the last answer; and the dataset's own
// answers (each run of assistant messages), for review beside the model's.
func splitTurns(msgs []message) ([]turnInput, [][]message) {
	var inputs []turnInput
	var answers [][]message
	var cur turnInput
	userSeen := false
	for i := 0; i < len(msgs); {
		msg := msgs[i]
		if msg.Role != "assistant" || !userSeen {
			userSeen = userSeen || msg.Role == "user"
			cur.msgs = append(cur.msgs, msg)
			i++
			continue
		}
		inputs = append(inputs, cur)
		cur = turnInput{}
		start := i
		for ; i < len(msgs) && msgs[i].Role == "assistant"; i++ {
			cur.calls = append(cur.calls, msgs[i].calls...)
		}
		answers = append(answers, msgs[start:i])
	}
	if len(cur.msgs) > 0 || len(inputs) == 0 {
		inputs = append(inputs, cur)
	}
	return inputs, answers
}

// stripSystemPrefix removes the source's literal system-prompt prefix and
// the spaces after it.
func (m *mapper) stripSystemPrefix(s string) string {
	p := m.src.StripSystemPrefix
	if p == "" || !strings.HasPrefix(s, p) {
		return s
	}
	return strings.TrimLeft(s[len(p):], " \t")
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
		msg := message{Role: role, Content: value, at: turnPath{field, i, valueKey}}
		if strings.EqualFold(from, "function_call") {
			call, rerr := functionCall(value, at.sub(valueKey), i)
			if rerr != nil {
				return nil, rerr
			}
			// A call right after an answer belongs to that answer (text
			// then call, or parallel calls), as one OpenAI message.
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
				msgs[n-1].calls = append(msgs[n-1].calls, call)
				msgs[n-1].ToolCalls = msgs[n-1].calls
				continue
			}
			msg.Content, msg.calls = nil, []conversation.ToolCall{call}
			msg.ToolCalls = msg.calls
		}
		msgs = append(msgs, msg)
	}
	if rerr := linkResults(msgs, true); rerr != nil {
		return nil, rerr
	}
	return msgs, nil
}

// functionCall parses a recorded call, {"name": ..., "arguments": {...}}
// (arguments may also be a JSON string), into a tool call with the id
// call_<i>, i being the turn's index in the conversation.
func functionCall(value, at string, i int) (conversation.ToolCall, *rowError) {
	var raw struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return conversation.ToolCall{}, fieldErr(at, "function_call is not JSON {name, arguments}: %v", err)
	}
	if raw.Name == "" {
		return conversation.ToolCall{}, fieldErr(at, "function_call has no name")
	}
	args, err := argumentsText(raw.Arguments)
	if err != nil {
		return conversation.ToolCall{}, fieldErr(at, "function_call arguments: %v", err)
	}
	var c conversation.ToolCall
	c.ID, c.Type = "call_"+strconv.Itoa(i), "function"
	c.Function.Name, c.Function.Arguments = raw.Name, args
	return c, nil
}

// argumentsText returns tool-call arguments as OpenAI sends them: a string
// holding compact JSON. A string value is taken as written; an object (or
// absent arguments, {}) is compacted.
func argumentsText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}

// linkResults points every tool result without a tool_call_id at the next
// unanswered call of the answer before it. With strict, a result that no
// call is left to answer is a bad row: sent to a server it would be a tool
// result for nothing, and a chat template would render it as such.
func linkResults(msgs []message, strict bool) *rowError {
	var pending []conversation.ToolCall
	for i := range msgs {
		msg := &msgs[i]
		switch msg.Role {
		case "assistant":
			pending = msg.calls
		case "tool":
			if msg.ToolCallID != "" {
				if len(pending) > 0 && pending[0].ID == msg.ToolCallID {
					pending = pending[1:]
				}
				continue
			}
			if len(pending) == 0 {
				if strict {
					return fieldErr(msg.at.String(), "tool result with no tool call before it to answer")
				}
				continue
			}
			msg.ToolCallID = pending[0].ID
			pending = pending[1:]
		default:
			pending = nil
		}
	}
	return nil
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
				parsed, err := parseCalls(calls)
				if err != nil {
					return nil, fieldErr(at.sub("tool_calls"), "%v", err)
				}
				msg.calls = parsed
			}
		}
		msgs = append(msgs, msg)
	}
	linkResults(msgs, false)
	return msgs, nil
}

// parseCalls reads OpenAI tool_calls into toolCalls (arguments as text).
func parseCalls(calls []any) ([]conversation.ToolCall, error) {
	out := make([]conversation.ToolCall, 0, len(calls))
	for i, c := range calls {
		obj, ok := c.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("call %d: want object, got %s", i, jsonType(c))
		}
		fn, _ := obj["function"].(map[string]any)
		name, _ := fn["name"].(string)
		if name == "" {
			return nil, fmt.Errorf("call %d: no function.name", i)
		}
		var tc conversation.ToolCall
		tc.ID, _ = obj["id"].(string)
		tc.Type = "function"
		tc.Function.Name = name
		switch a := fn["arguments"].(type) {
		case string:
			tc.Function.Arguments = a
		case nil:
			tc.Function.Arguments = "{}"
		default:
			b, err := json.Marshal(a)
			if err != nil {
				return nil, fmt.Errorf("call %d arguments: %v", i, err)
			}
			tc.Function.Arguments = string(b)
		}
		out = append(out, tc)
	}
	return out, nil
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
