package review

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/llm"
)

// Write prints s for a terminal: a header with the sample's fate, then
// every turn's input, the dataset's answer and the regenerated one. Text
// from the dataset or the model has its control characters shown as
// escapes, so no escape sequence reaches the terminal.
func Write(w io.Writer, s Sample) error {
	p := &printer{w: w}
	p.linef("sample %s", s.ID)
	p.linef("state %s, partition %s, lane %s, attempts %d", s.State, s.Partition, s.Lane, s.Attempts)
	if s.Origin != "" {
		p.linef("source %s", s.Origin)
	}
	p.linef("turns: %d answered of %d planned", answered(s), s.Planned)
	if s.EndedEarly != "" {
		p.linef("ended early: %s", s.EndedEarly)
	}
	if s.Rule != "" {
		p.linef("rejected by rule %s: %s", s.Rule, s.Evidence)
	}
	if s.Error != "" {
		p.linef("error: %s", s.Error)
	}
	if len(s.Tools) > 0 {
		p.linef("tools: %s", s.Tools)
	}
	if !s.OriginalsKept {
		p.linef("the dataset's answers were not kept for this sample (ingested before regen kept them, or the row has none)")
	}
	for _, t := range s.Turns {
		p.linef("")
		p.linef("── turn %d of %d ──", conversation.Ordinal(t.Turn), s.Planned)
		p.linef("input:")
		p.messages(t.Input)
		if t.Original != nil {
			p.linef("original (dataset):")
			p.messages(t.Original)
		}
		if t.Answer == nil {
			p.linef("regenerated: (not reached)")
			continue
		}
		p.answer(*t.Answer)
	}
	return p.err
}

func answered(s Sample) int {
	n := 0
	for _, t := range s.Turns {
		if t.Answer != nil {
			n++
		}
	}
	return n
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) linef(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = io.WriteString(p.w, safe(fmt.Sprintf(format, args...))+"\n")
}

// block prints text indented, control characters escaped.
func (p *printer) block(label, text string) {
	lines := strings.Split(text, "\n")
	p.linef("  %s%s", label, lines[0])
	for _, l := range lines[1:] {
		p.linef("  %s%s", strings.Repeat(" ", len(label)), l)
	}
}

func (p *printer) messages(msgs []conversation.Message) {
	for _, m := range msgs {
		label := "[" + m.Role + "] "
		if m.ToolCallID != "" {
			label = "[" + m.Role + " " + m.ToolCallID + "] "
		}
		if m.ReasoningContent != "" {
			p.block(label+"reasoning: ", m.ReasoningContent)
		}
		if c := text(m.Content); c != "" || len(m.ToolCalls) == 0 {
			p.block(label, c)
		}
		var calls []llm.ToolCall
		if len(m.ToolCalls) > 0 && json.Unmarshal(m.ToolCalls, &calls) == nil {
			p.calls(label, calls)
		} else if len(m.ToolCalls) > 0 {
			p.block(label+"tool calls: ", string(m.ToolCalls))
		}
	}
}

func (p *printer) calls(label string, calls []llm.ToolCall) {
	for _, c := range calls {
		p.block(label+"tool call: ", fmt.Sprintf("%s(%s) %s", c.Function.Name, c.Function.Arguments, c.ID))
	}
}

func (p *printer) answer(a Answer) {
	what := "regenerated"
	if a.Rejected {
		what = "regenerated, REJECTED"
	}
	p.linef("%s (lane %s, attempts %d, finish %s, %d prompt + %d completion tokens, %d reasoning, %d ms, ttft %d ms, %s):",
		what, a.Lane, a.Attempts, a.FinishReason, a.Usage.PromptTokens, a.Usage.CompletionTokens, a.Usage.ReasoningTokens,
		a.DurationMS, a.TTFTMS, a.Endpoint)
	if a.Reasoning != "" {
		p.block("[assistant] reasoning: ", a.Reasoning)
	}
	if a.Content != "" || len(a.ToolCalls) == 0 {
		p.block("[assistant] ", a.Content)
	}
	p.calls("[assistant] ", a.ToolCalls)
}

// text is a message content: a string as it is, anything else (content
// parts, null) as its JSON.
func text(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// safe shows control characters other than newline and tab as escapes, so
// dataset or model text cannot move the cursor or recolour the terminal.
func safe(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			fmt.Fprintf(&b, "\\x%02x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool {
	return r != '\n' && r != '\t' && (unicode.IsControl(r) || r == '\u2028' || r == '\u2029')
}
