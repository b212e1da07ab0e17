package export

import (
	"fmt"
	"strings"
)

// cardProfile says which trainer profile wrote the training files
// (output.trainer) and, for SpecForge, where SpecForge's own loader
// changes the prompt in ways no layout of the file can prevent.
func cardProfile(b *strings.Builder, m *Manifest) {
	var p Profile
	if m.Export != nil {
		p = m.Export.Profile
	}
	b.WriteString("## Trainer profile\n\n")
	switch p.Trainer {
	case TrainerSpeculators:
		b.WriteString("Written with `output.trainer: speculators`, for vLLM speculators. Its loader reads this layout as it is: `conversations` (roles system, user, assistant, tool; `tool_calls`, `tool_call_id`, `reasoning_content`) and `tools` as JSON text; with token ids, `input_ids` and `loss_mask` pass through. It renders each assistant turn as a row of its own through vLLM's `/render`, which it calls without `chat_template_kwargs`: pass each row's `chat_template_kwargs` there when they are not the template's defaults.\n\n")
	case TrainerSpecForge:
		cardSpecForge(b, m, p)
	default:
		b.WriteString("Written without `output.trainer`: the layout SpecForge and speculators both read where they agree. `output.trainer: specforge` or `speculators` lays the files out for one of them.\n\n")
	}
}

// shareGPTRows are the rows of the ShareGPT training file.
func shareGPTRows(m *Manifest) int {
	for _, f := range m.Files {
		if f.Format == FormatShareGPT {
			return f.Rows
		}
	}
	return 0
}

func cardSpecForge(b *strings.Builder, m *Manifest, p Profile) {
	b.WriteString("Written with `output.trainer: specforge`, for SpecForge. The ShareGPT training file holds one row per assistant turn, in the shape of SpecForge's generation events (`scripts/expand_reasoning_conversations.py`): `id` is `<conversation id>/turn<k>` with k counted from 1, `source_id` the conversation's id, `assistant_turn_index` the same turn counted from 0 (SpecForge's field), `conversations` the messages up to and including that turn's answer, earlier answers as they were sent back to the server. Train it with `data.train_only_last_turn: true`, so each row supervises its own answer only. The Parquet file keeps the layout both trainers read (SpecForge reads no Parquet).\n\n")
	if p.Harmony {
		b.WriteString("The model is gpt-oss: `conversations` use the roles of SpecForge's `gpt-oss` template, each answer as `assistant_analysis` (its reasoning) then `assistant_final` (its content), and rows carry no other column, since SpecForge's harmony parser takes none.\n\n")
	} else if len(p.Switches) > 0 {
		fmt.Fprintf(b, "Each row carries the chat template switches its answer was requested with as columns of their own (%s; null when the request did not send one): SpecForge hands every column but `conversations`, `id` and `tools` to the chat template as a variable.\n\n", "`"+strings.Join(p.Switches, "`, `")+"`")
	}
	b.WriteString("SpecForge's own loader still changes the prompt:\n\n")
	if p.Harmony {
		b.WriteString("- Its harmony parser writes its own system header (`Reasoning: low`, a fixed date) before a row that does not start with a system message, and a system message replaces that header: the prompt is not the server's rendering.\n")
	} else {
		fmt.Fprintf(b, "- A row without a system message (%d of the %d rows here) gets the template's default system prompt (\"You are a helpful assistant.\" for its qwen, qwen3, kimi-k2 and deepseek-v3 templates), which the server was never sent.\n", m.Totals.NoSystemRows, shareGPTRows(m))
		b.WriteString("- Its general parser keeps only `role`, `content` and `tool_calls` of a message: tool results lose `tool_call_id` (a template that prints the id renders another prompt) and `reasoning_content` is dropped; thinking templates keep both.\n")
		b.WriteString("- Its thinking parser sets `enable_thinking` to true whatever the row says and never sends `thinking`, the switch DeepSeek-V3.1/V3.2 and Kimi read: the `thinking` column is what carries it to their templates.\n")
	}
	b.WriteString("\n")
}

// cardSpecForgeColumns lists the SpecForge rows' columns in their order
// (specForgeRow.MarshalJSON).
func cardSpecForgeColumns(b *strings.Builder, p Profile, tokens bool) {
	cols := []string{"`id` string"}
	if !p.Harmony {
		cols = append(cols, "`source_id` string", "`assistant_turn_index` int")
	}
	msg := "{role, content, reasoning_content, tool_calls, tool_call_id, name}"
	if p.Harmony {
		msg = "{role, content}"
	}
	cols = append(cols, "`conversations` list<"+msg+">", "`tools` string")
	for _, k := range p.Switches {
		cols = append(cols, "`"+k+"` json?")
	}
	if tokens {
		cols = append(cols, "`input_ids` list<int32>", "`loss_mask` list<int8>")
	}
	b.WriteString("One JSON object per line, one per assistant turn, every line with the same keys (SpecForge's row shape, see Trainer profile above).\n\n")
	b.WriteString(strings.Join(cols, ", ") + "\n")
}

// cardSpecForgeNoIDs says where the SpecForge rows without token ids are
// and whether they say why (specForgeLine: harmony rows cannot).
func cardSpecForgeNoIDs(b *strings.Builder, m *Manifest, unit string) {
	t := m.Totals.TokenIDs
	if t == nil || t.Unavailable == 0 {
		return
	}
	why := "the same keys and `token_ids` (why) in place of `input_ids` and `loss_mask`"
	if m.Export.Profile.Harmony {
		why = "neither `input_ids` and `loss_mask` nor the reason, since SpecForge's harmony parser takes no other column (the no-token-ids Parquet file and an export without `output.trainer` say why)"
	}
	fmt.Fprintf(b, "\n%s without token ids: %d, in `%s` (not in this config), with %s.\n", unit, t.Unavailable, noIDsFile(m, FormatShareGPTNoTokenIDs), why)
}
