package export

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// The row types below give every line of a JSONL file the same keys, at
// every depth, with null or empty values where a row has nothing: trainers
// load these files through Hugging Face datasets, whose writers take the
// columns from the first row of a batch (SpecForge's offline loader raises
// KeyError: 'tools' on a batch that mixes rows with and without tools),
// and a reader that samples one row for its schema rejects a key it has
// not seen (docs/training-data.md, "Same keys on every row").

// sharegptMessage is one message of an exported conversation: content is
// always a string (content parts flattened to their text, "" beside tool
// calls); reasoning_content, tool_calls, tool_call_id and name are null
// when the message has none.
type sharegptMessage struct {
	Role             string         `json:"role"`
	Content          string         `json:"content"`
	ReasoningContent *string        `json:"reasoning_content"`
	ToolCalls        []toolCallLine `json:"tool_calls"`
	ToolCallID       *string        `json:"tool_call_id"`
	Name             *string        `json:"name"`
}

// toolCallLine is an OpenAI tool call with its arguments as JSON text.
type toolCallLine struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function toolFunctionLine `json:"function"`
}

type toolFunctionLine struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// usageLine is llm.Usage with every count present.
type usageLine struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CachedTokens     int `json:"cached_tokens"`
	ReasoningTokens  int `json:"reasoning_tokens"`
}

func usageOf(u llm.Usage) usageLine {
	return usageLine{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		CachedTokens: u.CachedTokens, ReasoningTokens: u.ReasoningTokens}
}

// provenanceLine is store.Provenance with every key present ("" or null
// when the server did not say).
type provenanceLine struct {
	Generation        int    `json:"generation"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Engine            string `json:"engine"`
	EngineVersion     string `json:"engine_version"`
	// Sampling is the request's sampling parameters as JSON text (null
	// when unknown), as in Parquet: the object's keys change with the
	// configuration, a string column does not.
	Sampling *string `json:"sampling"`
	Seed     *int64  `json:"seed"`
}

func provenanceOf(p store.Provenance) provenanceLine {
	return provenanceLine{Generation: p.Generation, Model: p.Model, SystemFingerprint: p.SystemFingerprint,
		Engine: p.Engine, EngineVersion: p.EngineVersion, Sampling: rawText(p.Sampling), Seed: p.Seed}
}

func sharegptMessages(conv []conversation.Message) []sharegptMessage {
	out := make([]sharegptMessage, len(conv))
	for i, m := range conv {
		out[i] = sharegptMessage{Role: m.Role, Content: contentText(m.Content),
			ReasoningContent: optional(m.ReasoningContent), ToolCalls: toolCallLines(m.ToolCalls),
			ToolCallID: optional(m.ToolCallID), Name: optional(m.Name)}
	}
	return out
}

// contentText is a message's content as text: a string as it is, null as
// "", and content parts as their text parts joined by newlines (other
// parts carry no text a text model was given).
func contentText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw) // neither text nor parts: kept as JSON text
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" && p.Text != nil {
			texts = append(texts, *p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// storedToolCall is a tool call as a stored message holds it: arguments
// may be JSON text or an object.
type storedToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// toolCallLines puts a message's tool calls in one shape, arguments as
// JSON text (a source may give them as an object); nil when there are
// none or they are not a list of calls.
func toolCallLines(raw json.RawMessage) []toolCallLine {
	var calls []storedToolCall
	if len(raw) == 0 || json.Unmarshal(raw, &calls) != nil || len(calls) == 0 {
		return nil
	}
	out := make([]toolCallLine, len(calls))
	for i, c := range calls {
		args := string(bytes.TrimSpace(c.Function.Arguments))
		var s string
		if json.Unmarshal(c.Function.Arguments, &s) == nil {
			args = s
		}
		out[i] = toolCallLine{ID: c.ID, Type: c.Type, Function: toolFunctionLine{Name: c.Function.Name, Arguments: args}}
	}
	return out
}

// toolsText is a conversation's tools as compact JSON text, "[]" when it
// has none: both trainers accept tools as a JSON string, and a string
// column keeps one type whatever each row's tool schemas hold.
func toolsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "[]"
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// templateKwargs is the chat_template_kwargs the request of an answer sent
// (its stored sampling parameters), as JSON text: "{}" when it sent none,
// null when the answer does not record its request (a store from before
// provenance). Text, like tools: the keys change with the model, a string
// column does not. A trainer that re-renders the conversation passes them
// to the template (speculators' render client takes chat_template_kwargs,
// vllm-project/speculators c05b95b render_client.py l.34/50; its
// _encode_render does not pass them yet, docs/training-data.md).
func templateKwargs(p store.Provenance) *string {
	if len(p.Sampling) == 0 {
		return nil
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(p.Sampling, &params) != nil {
		return nil
	}
	kw, ok := params["chat_template_kwargs"]
	if !ok || string(kw) == "null" {
		s := "{}"
		return &s
	}
	var b bytes.Buffer
	if json.Compact(&b, kw) != nil {
		return nil
	}
	s := b.String()
	return &s
}
