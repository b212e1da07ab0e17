package export

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/job"
)

// Trainer profiles (output.trainer): the layout of the ShareGPT training
// file for one trainer. Unset, it is the layout SpecForge and speculators
// both read (docs/training-data.md, "Trainer profiles").
const (
	TrainerSpeculators = job.TrainerSpeculators
	TrainerSpecForge   = job.TrainerSpecForge
)

// Profile is the trainer the training files are laid out for, kept in the
// manifest's export settings so Verify renders them the same way.
type Profile struct {
	// Trainer is "", TrainerSpeculators (the same layout as "", which is
	// what speculators reads) or TrainerSpecForge.
	Trainer string `json:"trainer,omitempty"`
	// Harmony: SpecForge rows use the harmony roles of its gpt-oss
	// template (assistant_analysis, assistant_final) for the assistant's
	// reasoning and answer, and carry no column but id, conversations,
	// tools and the token fields.
	Harmony bool `json:"harmony_roles,omitempty"`
	// Switches are the chat_template_kwargs keys that SpecForge rows carry
	// as columns of their own: SpecForge passes a row's columns to the
	// chat template as variables, so the switch reaches the template.
	Switches []string `json:"template_switches,omitempty"`
}

// ProfileOf is the profile of spec's output.trainer: whether the model is
// gpt-oss (job.HarmonyModel) and which switches its requests send.
func ProfileOf(spec *job.Spec) Profile {
	p := Profile{Trainer: spec.Output.Trainer}
	if p.Trainer != TrainerSpecForge {
		return p
	}
	if job.HarmonyModel(spec.Model) {
		p.Harmony = true
		return p
	}
	p.Switches = spec.Generation.TemplateSwitches()
	return p
}

// check refuses options the profile cannot write: SpecForge hands every
// column to the chat template (run details have no place), and its rows
// are turns, so token ids must be too.
func (p Profile) check(o Options) error {
	switch {
	case p.Trainer != "" && p.Trainer != TrainerSpeculators && p.Trainer != TrainerSpecForge:
		return fmt.Errorf("unknown trainer profile %q (want %s or %s)", p.Trainer, TrainerSpeculators, TrainerSpecForge)
	case !p.specForge():
		return nil
	case o.Metadata == MetadataFull:
		return fmt.Errorf("output.trainer %s: metadata full adds run-detail columns, which SpecForge would pass to the chat template; export with output.trainer unset for them", p.Trainer)
	case o.TokenIDs && o.TokenRows != TokenRowsTurn:
		return fmt.Errorf("output.trainer %s: its rows are turns, so token ids need output.token_rows: turn", p.Trainer)
	}
	return nil
}

// specForge reports whether the profile is SpecForge's.
func (p Profile) specForge() bool { return p.Trainer == TrainerSpecForge }

// specForgeRow is one training row in the shape of SpecForge's
// generation events (scripts/expand_reasoning_conversations.py
// expand_row, sgl-project/SpecForge a6b6b02 l.135-143): one assistant
// turn, the conversation up to its answer, the conversation's id as
// source_id and the turn's index from 0 as assistant_turn_index, trained
// with data.train_only_last_turn: true. Keys are written in this order;
// Harmony rows have only id, conversations, tools and the token fields.
type specForgeRow struct {
	ID            string
	SourceID      string
	TurnIndex     int
	Conversations any // []sharegptMessage, or []harmonyMessage
	Tools         string
	Switches      []string
	Values        map[string]json.RawMessage // the row's switch values
	Harmony       bool
	Tokens        *tokenFields
	// Missing is why the row has no ids, written as token_ids last on
	// the rows of the no-token-ids file (specForgeLine).
	Missing string
}

// MarshalJSON writes the row's keys in order, the switches among them.
func (r specForgeRow) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	var err error
	put := func(key string, v any) {
		if err != nil {
			return
		}
		raw, ok := v.(json.RawMessage)
		if !ok {
			if raw, err = plainJSON(v); err != nil {
				err = fmt.Errorf("%s: %w", key, err)
				return
			}
		}
		k, _ := json.Marshal(key)
		b.WriteByte(map[bool]byte{true: '{', false: ','}[b.Len() == 0])
		b.Write(k)
		b.WriteByte(':')
		b.Write(raw)
	}
	put("id", r.ID)
	if !r.Harmony {
		put("source_id", r.SourceID)
		put("assistant_turn_index", r.TurnIndex)
	}
	put("conversations", r.Conversations)
	put("tools", r.Tools)
	for _, k := range r.Switches {
		v := r.Values[k]
		if len(v) == 0 {
			v = json.RawMessage("null")
		}
		put(k, v)
	}
	if r.Tokens != nil {
		put("input_ids", r.Tokens.InputIDs)
		put("loss_mask", r.Tokens.LossMask)
	}
	if r.Missing != "" {
		put("token_ids", r.Missing)
	}
	if err != nil {
		return nil, err
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// plainJSON is v as JSON without HTML escaping, like the line encoder.
func plainJSON(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// harmonyMessage is a message with one of the roles SpecForge's gpt-oss
// parser takes (HarmonyParser.build_single_turn_prompt, specforge/data/
// parse.py l.358-385): system, user, assistant_analysis (the reasoning),
// assistant_final (the answer). It reads role and content only.
type harmonyMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// harmonyMessages maps a conversation to harmony roles: an assistant
// message becomes assistant_analysis (its reasoning, when it has any)
// then assistant_final (its content). A tool call or a tool result has no
// harmony role in SpecForge's parser: an error naming the message.
func harmonyMessages(conv []conversation.Message) ([]harmonyMessage, error) {
	var out []harmonyMessage
	for i, m := range conv {
		switch {
		case m.Role == "tool" || m.Role == "assistant" && toolCallLines(m.ToolCalls) != nil:
			return nil, fmt.Errorf("conversations[%d]: SpecForge's gpt-oss roles have no place for a tool call or a tool result; export with output.trainer unset", i)
		case m.Role == "assistant":
			if m.ReasoningContent != "" {
				out = append(out, harmonyMessage{Role: "assistant_analysis", Content: m.ReasoningContent})
			}
			out = append(out, harmonyMessage{Role: "assistant_final", Content: contentText(m.Content)})
		case m.Role == "system" || m.Role == "user":
			out = append(out, harmonyMessage{Role: m.Role, Content: contentText(m.Content)})
		default:
			return nil, fmt.Errorf("conversations[%d]: role %q has no harmony role in SpecForge's gpt-oss parser", i, m.Role)
		}
	}
	return out, nil
}

// switchValues are the values of the profile's switches in the
// chat_template_kwargs the row's last answer was requested with.
func switchValues(r *record) map[string]json.RawMessage {
	kw := templateKwargs(r.last())
	if kw == nil {
		return nil
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal([]byte(*kw), &m) // templateKwargs wrote compact JSON
	return m
}

// specForgeLine is the SpecForge row of r (one turn, with rows()). missing,
// for a row of the no-token-ids file, is why it has no ids: written as the
// default layout writes it (token_ids), except on harmony rows. That file
// is read only by a trainer that renders the text itself; SpecForge doing
// so hands every column but id, conversations and tools to its parser
// (specforge/data/preprocessing.py build_eagle3_dataset), and its general
// and thinking parsers pass it on to apply_chat_template as a template
// variable no template reads, while HarmonyParser.parse takes no extra
// keyword and would raise a TypeError (specforge/data/parse.py).
func (p Profile) specForgeLine(r *record, tokens *tokenFields, missing string) (specForgeRow, error) {
	row := specForgeRow{ID: r.row.ID, SourceID: r.conversationID, TurnIndex: r.turn, Tools: toolsText(r.plan.Tools),
		Harmony: p.Harmony, Tokens: tokens}
	if !p.Harmony {
		row.Missing = missing
	}
	if p.Harmony {
		msgs, err := harmonyMessages(r.conv)
		if err != nil {
			return row, fmt.Errorf("sample %s: %w", r.row.ID, err)
		}
		row.Conversations = msgs
		return row, nil
	}
	row.Conversations = sharegptMessages(r.conv)
	row.Switches, row.Values = p.Switches, switchValues(r)
	return row, nil
}
