package export

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// cardConfig is the part of the manifest's configuration the card
// explains, with the job file's field names.
type cardConfig struct {
	Sources []struct {
		Partition        string `json:"partition"`
		Path             string `json:"path"`
		Preset           string `json:"preset"`
		Regenerate       string `json:"regenerate"`
		SamplesPerPrompt int    `json:"samples_per_prompt"`
	} `json:"sources"`
	Lanes []struct {
		Name       string   `json:"name"`
		MaxTokens  int      `json:"max_tokens"`
		Partitions []string `json:"partitions"`
	} `json:"lanes"`
	Generation struct {
		Temperature        *float64       `json:"temperature"`
		TopP               *float64       `json:"top_p"`
		ChatTemplateKwargs map[string]any `json:"chat_template_kwargs"`
		Extra              map[string]any `json:"extra"`
		Reasoning          string         `json:"reasoning"`
	} `json:"generation"`
	Quality map[string]any `json:"quality"`
}

// reasoningModes say what each generation.reasoning does to thinking.
var reasoningModes = map[string]string{
	"keep":          "kept in the records and sent back with the history of later turns",
	"strip_history": "kept in the records (every assistant turn's `reasoning_content`), not sent back with the history of later turns",
	"disable":       "turned off through `chat_template_kwargs`",
}

func cardHowMade(b *strings.Builder, m *Manifest) {
	var c cardConfig
	if len(m.Configuration) == 0 || json.Unmarshal(m.Configuration, &c) != nil {
		return // a manifest without the job's configuration: nothing to explain
	}
	b.WriteString("## How it was made\n\n")
	for _, s := range c.Sources {
		what := "every assistant turn, in order, each conditioned on the turns regenerated before it"
		if s.Regenerate == "last" {
			what = "the last assistant turn (earlier turns are the source's)"
		}
		fmt.Fprintf(b, "- `%s` from `%s`", s.Partition, s.Path)
		if s.Preset != "" {
			fmt.Fprintf(b, " (preset %s)", s.Preset)
		}
		fmt.Fprintf(b, ": regenerated %s", what)
		if s.SamplesPerPrompt > 1 {
			fmt.Fprintf(b, "; %d answers per prompt, each with its own seed", s.SamplesPerPrompt)
		}
		b.WriteString(".\n")
	}
	g := c.Generation
	fmt.Fprintf(b, "- Sampling: temperature %s, top_p %s", number(g.Temperature), number(g.TopP))
	for _, l := range c.Lanes {
		fmt.Fprintf(b, "; max_tokens %d in lane `%s`", l.MaxTokens, l.Name)
		if len(l.Partitions) > 0 {
			fmt.Fprintf(b, " (%s)", strings.Join(l.Partitions, ", "))
		}
	}
	b.WriteString(".\n")
	if len(g.ChatTemplateKwargs) > 0 {
		fmt.Fprintf(b, "- chat_template_kwargs: `%s`.\n", compactJSON(g.ChatTemplateKwargs))
	}
	if len(g.Extra) > 0 {
		fmt.Fprintf(b, "- Extra request fields: `%s`.\n", compactJSON(g.Extra))
	}
	if mode := reasoningModes[g.Reasoning]; mode != "" {
		fmt.Fprintf(b, "- Reasoning (`%s`): %s.\n", g.Reasoning, mode)
	}
	if rules := qualityRules(c.Quality); len(rules) > 0 {
		fmt.Fprintf(b, "- Quality rules: %s (a sample whose answer fails one is rejected and left out of the training files).\n", strings.Join(rules, ", "))
	}
	if m.Generation > 0 {
		fmt.Fprintf(b, "- Configuration generation %d, fingerprint `%.12s`.\n", m.Generation, m.Fingerprint)
	}
	b.WriteString("\n")
}

// number is a sampling parameter, or the server's default when unset.
func number(f *float64) string {
	if f == nil {
		return "the server's default"
	}
	return fmt.Sprint(*f)
}

func compactJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// qualityRules names the rules that were on.
func qualityRules(q map[string]any) []string {
	var on []string
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch v := q[k].(type) {
		case bool:
			if v {
				on = append(on, k)
			}
		case []any:
			if len(v) > 0 {
				on = append(on, k)
			}
		case map[string]any:
			if n, ok := v["max_repeats"].(float64); !ok || n > 0 {
				on = append(on, k)
			}
		}
	}
	return on
}

// cardLayoutNote says where the training files are, why the card has one
// config, and what chat_template_kwargs is for.
func cardLayoutNote(b *strings.Builder, m *Manifest) {
	b.WriteString("They are in `" + DataDir + "/`: point a trainer at that folder or at a file in it (the other files are side files, outside it). The card's config names one of them: `datasets` reads every config of a card with one builder. ")
	rows := "Each row's"
	if m.Export != nil && m.Export.Profile.specForge() {
		rows = "Each Parquet row's" // the ShareGPT rows carry the switches as columns
	}
	b.WriteString(rows + " `chat_template_kwargs` is the template switches the server rendered its last answer with (JSON text, `\"{}\"` when none were sent): a trainer that renders the conversation again must pass them, or it renders the other mode.\n\n")
}

// cardSchemas gives each config's row layout, read from the types the
// writers encode, so the card cannot drift from the files.
func cardSchemas(b *strings.Builder, m *Manifest) {
	configs := trainingFiles(m)
	if len(configs) == 0 {
		return
	}
	full, tokens, turns := false, false, false
	if m.Export != nil {
		full, tokens, turns = m.Export.Metadata == MetadataFull, m.Export.TokenIDs, m.Export.TokenRows == TokenRowsTurn
	}
	b.WriteString("## Configs and row schema\n\n")
	if turns {
		b.WriteString("The training files hold the same rows, one per assistant turn (`output.token_rows: turn`): `id` is `<conversation id>/turn<k>`, `conversation_id` the conversation's id, `turn` k (from 1), `conversations` the messages up to and including that turn's answer, `input_ids` that turn's prompt ids as the server returned them followed by its completion ids, `loss_mask` 1 exactly on the completion ids.\n\n")
	} else if m.Export != nil && m.Export.Profile.specForge() {
		b.WriteString("The ShareGPT file holds one row per assistant turn (SpecForge's row shape), the Parquet file one row per conversation.\n\n")
	} else {
		b.WriteString("The training files hold the same conversations, one row each.\n\n")
	}
	unit := "Conversations"
	if turns {
		unit = "Turn rows"
	}
	if n := m.Totals.TokenIDs; n != nil {
		fmt.Fprintf(b, "%s with token ids: %d; without: %d.\n\n", unit, n.With, n.Unavailable)
	}
	cardLayoutNote(b, m)
	for i, c := range configs {
		def := ", the config"
		if i > 0 {
			def = fmt.Sprintf(`, not a config: load it with load_dataset("%s", data_files=...)`, c[0])
		}
		fmt.Fprintf(b, "### `%s` (`%s`%s)\n\n", c[0], c[1], def)
		switch c[0] {
		case FormatParquet:
			b.WriteString("The ShareGPT line's layout: `conversations` holds every message, the last answer included, as `{role, content, reasoning_content, tool_calls, tool_call_id, name}` (tool calls as `{id, type, function: {name, arguments}}`); `tools` is JSON text (`\"[]\"` when none); the other columns stand beside them.\n\n")
			var t reflect.Type = reflect.TypeFor[ParquetRow]()
			switch {
			case turns:
				t = reflect.TypeFor[ParquetTurnRow]()
			case tokens:
				t = reflect.TypeFor[ParquetTokenRow]()
			}
			writeColumns(b, t, "parquet")
			if n := m.Totals.TokenIDs; n != nil && n.Unavailable > 0 {
				fmt.Fprintf(b, "\n%s without token ids: %d, in `%s` (not in this config), with `token_ids` (why) in place of `input_ids` and `loss_mask`.\n", unit, n.Unavailable, noIDsFile(m, FormatParquetNoTokenIDs))
			}
			if !full {
				b.WriteString("\n`endpoint`, `seed`, `generation`, `model`, `engine`, `engine_version`, `system_fingerprint` and `sampling` are null: the export ran with `output.metadata: minimal`.\n")
			}
		case FormatShareGPT:
			if m.Export != nil && m.Export.Profile.specForge() {
				cardSpecForgeColumns(b, m.Export.Profile, tokens)
				cardSpecForgeNoIDs(b, m, unit)
				break
			}
			b.WriteString("One JSON object per line, every line with the same keys; `conversations` holds every message, the regenerated answers included, as `{role, content, reasoning_content, tool_calls, tool_call_id, name}` (content a string, the others null when a message has none); `tools` is the OpenAI tool list as JSON text (`\"[]\"` when none).\n\n")
			writeColumns(b, reflect.TypeFor[sharegptLine](), "json", shareGPTSkip(full, tokens, turns)...)
			if t := m.Totals.TokenIDs; t != nil && t.Unavailable > 0 {
				fmt.Fprintf(b, "\n%s without token ids: %d, in `%s` (not in this config), with the same keys and `token_ids` (why) in place of `input_ids` and `loss_mask`.\n", unit, t.Unavailable, noIDsFile(m, FormatShareGPTNoTokenIDs))
			}
		}
		if f := noIDsFile(m, c[0]+"-truncated"); f != "" && m.Totals.Truncated > 0 {
			fmt.Fprintf(b, "\nAnswers cut at max_tokens (`truncated: true`): %d, in `%s`, not in this file: the trainers ignore the flag and would learn half answers (`output.train_truncated: true` keeps them here).\n", m.Totals.Truncated, f)
		}
		b.WriteString("\n")
	}
}

// shareGPTSkip are the embedded groups of sharegptLine a record lacks.
func shareGPTSkip(full, tokens, turns bool) []string {
	var skip []string
	if !turns {
		skip = append(skip, "turnKeys")
	}
	if !full {
		skip = append(skip, "runDetails")
	}
	if !tokens {
		skip = append(skip, "tokenFields")
	}
	return append(skip, "missingTokens") // only in the no-token-ids file
}

// noIDsFile is the manifest's no-token-ids file of format.
func noIDsFile(m *Manifest, format string) string {
	for _, f := range m.Files {
		if f.Format == format {
			return f.Path
		}
	}
	return ""
}

// writeColumns lists a record type's fields by their tag key's name with
// their Go type, walking embedded structs except those in skip.
func writeColumns(b *strings.Builder, t reflect.Type, key string, skip ...string) {
	var cols []string
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			ft := f.Type
			if f.Anonymous {
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if !slices.Contains(skip, ft.Name()) {
					walk(ft)
				}
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get(key), ",")
			cols = append(cols, fmt.Sprintf("`%s` %s", name, columnType(ft)))
		}
	}
	walk(t)
	b.WriteString(strings.Join(cols, ", ") + "\n")
}

// columnType is a field's type in words a reader of either file knows.
func columnType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return columnType(t.Elem()) + "?"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 && t.Name() == "RawMessage" {
			return "json"
		}
		return "list<" + columnType(t.Elem()) + ">"
	case reflect.Struct:
		return "struct"
	}
	return t.Kind().String()
}

func cardCounts(b *strings.Builder, m *Manifest) {
	b.WriteString("## Counts\n\n| partition | lane | done | rejected | dead |\n|---|---|---:|---:|---:|\n")
	for _, c := range m.Cells {
		fmt.Fprintf(b, "| %s | %s | %d | %d | %d |\n", c.Partition, c.Lane, c.Done, c.Rejected, c.Dead)
	}
	t := m.Totals
	fmt.Fprintf(b, "| **total** | | **%d** | **%d** | **%d** |\n\n", t.Done, t.Rejected, t.Dead)
	if t.BadRows > 0 || t.Pending > 0 {
		fmt.Fprintf(b, "%d source rows could not be read (in the dead-letter file); %d samples were not finished at export.\n\n", t.BadRows, t.Pending)
	}
	if len(m.Rejects) > 0 {
		b.WriteString("Rejected by rule:\n\n| partition | lane | rule | samples |\n|---|---|---|---:|\n")
		for _, r := range m.Rejects {
			fmt.Fprintf(b, "| %s | %s | %s | %d |\n", r.Partition, r.Lane, r.Rule, r.N)
		}
		b.WriteString("\n")
	}
	p, c := m.Tokens.Prompt, m.Tokens.Completion
	fmt.Fprintf(b, "Tokens per answer (p50 / p90 / p99 / max): prompt %d / %d / %d / %d, completion %d / %d / %d / %d.\n\n",
		p.P50, p.P90, p.P99, p.Max, c.P50, c.P90, c.P99, c.Max)
}
