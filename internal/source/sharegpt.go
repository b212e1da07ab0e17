package source

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/regen-dev/regen/internal/llm"
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

// shareGPT maps [{"from":..., "value":...}] turns; role/content keys are accepted too.
func shareGPT(row map[string]any, field string) ([]message, *rowError) {
	list, rerr := listField(row, field)
	if rerr != nil {
		return nil, rerr
	}
	msgs := make([]message, 0, len(list))
	for i, e := range list {
		turn, at, rerr := turnObject(field, i, e)
		if rerr != nil {
			return nil, rerr
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
			msg.Content, msg.calls = nil, []llm.ToolCall{call}
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
func functionCall(value, at string, i int) (llm.ToolCall, *rowError) {
	var raw struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return llm.ToolCall{}, fieldErr(at, "function_call is not JSON {name, arguments}: %v", err)
	}
	if raw.Name == "" {
		return llm.ToolCall{}, fieldErr(at, "function_call has no name")
	}
	args, err := argumentsText(raw.Arguments)
	if err != nil {
		return llm.ToolCall{}, fieldErr(at, "function_call arguments: %v", err)
	}
	var c llm.ToolCall
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
	var pending []llm.ToolCall
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
