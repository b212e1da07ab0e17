package source

import (
	"strings"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
)

// messages maps the row's turns and splits them by the source's
// regeneration mode into turn 0's input and the later turns (none for a
// single turn). The system prompt is prepended when the row has none.
func (m *mapper) messages(row map[string]any) ([]message, []turnInput, [][]message, *rowError) {
	msgs, field, rerr := m.rowMessages(row)
	if rerr != nil {
		return nil, nil, nil, rerr
	}
	if msgs, rerr = m.withSystem(row, msgs); rerr != nil {
		return nil, nil, nil, rerr
	}
	inputs, originals := m.split(msgs)
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

// rowMessages maps the source's conversations, messages or prompt field;
// field is the one it read.
func (m *mapper) rowMessages(row map[string]any) (msgs []message, field string, rerr *rowError) {
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
			return nil, field, fieldErr(field, "missing")
		}
		s, ok := asString(v)
		if !ok {
			return nil, field, wrongType(field, "string", v)
		}
		msgs = []message{{Role: "user", Content: s, at: turnPath{field: field, i: -1}}}
	default:
		return nil, "", &rowError{reason: "source maps none of conversations, messages or prompt"}
	}
	return msgs, field, rerr
}

// withSystem strips the source's system prefix and prepends its system
// prompt (literal, or from the system field) when the row has none.
func (m *mapper) withSystem(row map[string]any, msgs []message) ([]message, *rowError) {
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
	sys = m.stripSystemPrefix(sys)
	if len(msgs) > 0 && msgs[0].Role == "system" {
		if s, ok := msgs[0].Content.(string); ok {
			msgs[0].Content = m.stripSystemPrefix(s)
		}
	}
	if strings.TrimSpace(sys) != "" && (len(msgs) == 0 || msgs[0].Role != "system") {
		msgs = append([]message{{Role: "system", Content: sys}}, msgs...)
	}
	return msgs, nil
}

// split cuts msgs into the inputs of the turns the source regenerates and
// the dataset's own answers to them.
func (m *mapper) split(msgs []message) ([]turnInput, [][]message) {
	if m.src.Regenerate != job.RegenerateLast {
		return splitTurns(msgs)
	}
	// Only the final answer is regenerated: the prompt is everything up
	// to the last non-assistant turn, history as the dataset wrote it.
	end := len(msgs)
	for end > 0 && msgs[end-1].Role == "assistant" {
		end--
	}
	if end < len(msgs) {
		return []turnInput{{msgs: msgs[:end]}}, [][]message{msgs[end:]}
	}
	return []turnInput{{msgs: msgs[:end]}}, nil
}

// asksForAnswer reports whether a message with role can end a prompt.
func asksForAnswer(role string) bool {
	return role != "system" && role != "developer" && role != "assistant"
}

// turnInput is the input of one turn and the tool calls recorded in the
// answer before it (only when the input starts with their results).
type turnInput struct {
	msgs  []message
	calls []llm.ToolCall
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
