package source

import (
	"encoding/json"
	"fmt"

	"github.com/regen-dev/regen/internal/llm"
)

// openAIRoles are the roles accepted in a `messages` field.
var openAIRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
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
		obj, at, rerr := turnObject(field, i, e)
		if rerr != nil {
			return nil, rerr
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
func parseCalls(calls []any) ([]llm.ToolCall, error) {
	out := make([]llm.ToolCall, 0, len(calls))
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
		var tc llm.ToolCall
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
