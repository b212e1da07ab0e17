package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// CheckShareGPTLine checks one line of a sharegpt export against the
// training-data contract of SpecForge's documented conversation format
// (docs/basic_usage/data_preparation.md, "Option 1: Conversation Format",
// and the regeneration and parsing scripts that read it):
//
//   - id is a non-empty string; conversations a non-empty list;
//   - every message has a role (system, user, assistant or tool) and a
//     string content; an optional system message comes first, then a
//     user message; an assistant message follows a user or tool message, a
//     tool message follows an assistant message with tool_calls (or another
//     tool message) and names one of its calls by tool_call_id; the last
//     message is the assistant's;
//   - reasoning_content, when present and not null, is a string on an
//     assistant message;
//   - tool_calls (not null) appear on assistant messages only, each {id, type:
//     "function", function: {name, arguments}} with arguments a string
//     holding a JSON object, naming a tool of tools when tools are given;
//   - content and reasoning_content hold no <think> or </think> marker;
//   - tools, when present, is a list of {type: "function", function: {name}},
//     or that list as JSON text (as regen writes it: both trainers take it).
//
// Other keys (partition, run details) are allowed: SpecForge ignores them.
func CheckShareGPTLine(line []byte) error {
	var rec struct {
		ID            *string           `json:"id"`
		Conversations []json.RawMessage `json:"conversations"`
		Tools         json.RawMessage   `json:"tools"`
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&rec); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	if rec.ID == nil || *rec.ID == "" {
		return errors.New("id: missing or empty")
	}
	if len(rec.Conversations) == 0 {
		return errors.New("conversations: missing or empty")
	}
	tools, err := toolNames(rec.Tools)
	if err != nil {
		return err
	}
	c := convChecker{tools: tools}
	for i, raw := range rec.Conversations {
		if err := c.message(i, raw); err != nil {
			return err
		}
	}
	if c.prev != "assistant" {
		return fmt.Errorf("conversations: ends with a %s message, want the assistant's", c.prev)
	}
	return nil
}

// convChecker checks a conversation message by message.
type convChecker struct {
	tools   map[string]bool
	prev    string          // the role of the message before
	pending map[string]bool // calls of the last assistant message not yet answered
}

// message checks message i: its fields, then its place after the one before.
func (c *convChecker) message(i int, raw json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("conversations[%d]: not an object", i)
	}
	at := fmt.Sprintf("conversations[%d]", i)
	role, err := messageFields(at, m)
	if err != nil {
		return err
	}
	switch role {
	case "system":
		if i != 0 {
			return fmt.Errorf("%s: a system message after the first", at)
		}
	case "user":
		c.pending = nil
	case "assistant":
		if c.prev != "user" && c.prev != "tool" {
			return fmt.Errorf("%s: an assistant message after %q, want after user or tool", at, c.prev)
		}
		if c.pending, err = checkCalls(at, m["tool_calls"], c.tools); err != nil {
			return err
		}
	case "tool":
		var id string
		_ = json.Unmarshal(m["tool_call_id"], &id)
		switch {
		case c.prev != "assistant" && c.prev != "tool":
			return fmt.Errorf("%s: a tool message after %q, want after an assistant's tool call", at, c.prev)
		case !c.pending[id]:
			return fmt.Errorf("%s.tool_call_id: %q answers no pending call of the assistant message before it", at, id)
		}
		delete(c.pending, id)
	default:
		return fmt.Errorf("%s.role: %q, want system, user, assistant or tool", at, role)
	}
	if i == 0 && role != "system" && role != "user" || i == 1 && c.prev == "system" && role != "user" {
		return fmt.Errorf("%s: the conversation must start with a user message (after an optional system one)", at)
	}
	c.prev = role
	return nil
}

// messageFields checks a message's role, content, reasoning_content and
// where its tool_calls are, and returns its role.
func messageFields(at string, m map[string]json.RawMessage) (string, error) {
	var role, content string
	if err := json.Unmarshal(m["role"], &role); err != nil {
		return "", fmt.Errorf("%s.role: missing or not a string", at)
	}
	if c := bytes.TrimSpace(m["content"]); len(c) == 0 || c[0] != '"' || json.Unmarshal(c, &content) != nil {
		return "", fmt.Errorf("%s.content: missing or not a string", at)
	}
	if err := noThinkMarker(at+".content", content); err != nil {
		return "", err
	}
	if present(m["reasoning_content"]) {
		var rc string
		if role != "assistant" || json.Unmarshal(m["reasoning_content"], &rc) != nil {
			return "", fmt.Errorf("%s.reasoning_content: only a string on an assistant message", at)
		}
		if err := noThinkMarker(at+".reasoning_content", rc); err != nil {
			return "", err
		}
	}
	if present(m["tool_calls"]) && role != "assistant" {
		return "", fmt.Errorf("%s.tool_calls: on a %s message", at, role)
	}
	return role, nil
}

// present is a key given a value other than null.
func present(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}

func noThinkMarker(at, s string) error {
	for _, m := range []string{"<think>", "</think>"} {
		if strings.Contains(s, m) {
			return fmt.Errorf("%s: holds %s", at, m)
		}
	}
	return nil
}

// toolNames checks tools and returns their names (nil when absent).
func toolNames(raw json.RawMessage) (map[string]bool, error) {
	if !present(raw) {
		return nil, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		raw = json.RawMessage(text)
	}
	var tools []struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, fmt.Errorf("tools: not a list of tool objects: %w", err)
	}
	if len(tools) == 0 {
		return nil, nil // "[]": no tools given, as when the key is absent
	}
	names := map[string]bool{}
	for i, t := range tools {
		if t.Type != "function" || t.Function == nil || t.Function.Name == "" {
			return nil, fmt.Errorf("tools[%d]: want {type: function, function: {name, ...}}", i)
		}
		names[t.Function.Name] = true
	}
	return names, nil
}

// checkCalls checks an assistant message's tool_calls and returns their ids.
func checkCalls(at string, raw json.RawMessage, tools map[string]bool) (map[string]bool, error) {
	if !present(raw) {
		return nil, nil
	}
	var calls []storedToolCall
	if err := json.Unmarshal(raw, &calls); err != nil || len(calls) == 0 {
		return nil, fmt.Errorf("%s.tool_calls: want a non-empty list of calls", at)
	}
	ids := map[string]bool{}
	for j, c := range calls {
		ca := fmt.Sprintf("%s.tool_calls[%d]", at, j)
		var args string
		var obj map[string]any
		switch {
		case c.ID == "":
			return nil, fmt.Errorf("%s.id: missing", ca)
		case c.Type != "function":
			return nil, fmt.Errorf("%s.type: %q, want function", ca, c.Type)
		case c.Function.Name == "":
			return nil, fmt.Errorf("%s.function.name: missing", ca)
		case tools != nil && !tools[c.Function.Name]:
			return nil, fmt.Errorf("%s.function.name: %q is not among the tools", ca, c.Function.Name)
		case json.Unmarshal(c.Function.Arguments, &args) != nil:
			return nil, fmt.Errorf("%s.function.arguments: want a string", ca)
		case json.Unmarshal([]byte(args), &obj) != nil || obj == nil:
			return nil, fmt.Errorf("%s.function.arguments: %q is not a JSON object", ca, args)
		}
		ids[c.ID] = true
	}
	return ids, nil
}
