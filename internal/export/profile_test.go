package export

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// thinkingRows are a two-turn thinking conversation and a one-turn one,
// each answer requested with chat_template_kwargs {"thinking": true}.
func thinkingRows(t *testing.T) []store.Row {
	t.Helper()
	u := llm.Usage{PromptTokens: 4, CompletionTokens: 2}
	p := store.Provenance{Generation: 1, Sampling: json.RawMessage(`{"chat_template_kwargs":{"thinking":true},"max_tokens":9}`)}
	with := func(r llm.Result) []byte { return withProvenance(t, r, p) }
	a0 := llm.Result{Content: "first", ReasoningContent: "why first", FinishReason: "stop", Usage: u}
	a1 := llm.Result{Content: "second", ReasoningContent: "why second", FinishReason: "stop", Usage: u}
	multi := turnRow(t, "P1/m", `{"messages":[{"role":"user","content":"a"}],"turns":[{"input":[{"role":"user","content":"b"}]}]}`, "", a0, a1)
	multi.Prior[0].Response, multi.Result.Response = with(a0), with(a1)
	one := doneRow(t, "P1/s", `{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"c"}]}`, a0)
	one.Result.Response = with(a0)
	return []store.Row{multi, one}
}

func exportProfile(t *testing.T, rows []store.Row, o Options) (Summary, []string, string) {
	t.Helper()
	dir := t.TempDir()
	sum, err := ExportWith(context.Background(), &fakeStore{rows: rows}, dir, []string{FormatShareGPT, FormatParquet}, "j", o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, DataDir, "j.sharegpt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return sum, strings.Split(string(bytes.TrimSpace(b)), "\n"), dir
}

// keysInOrder are a JSON object's keys in the order the line has them.
func keysInOrder(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", line)
	}
	var keys []string
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// The SpecForge profile writes one row per assistant turn in SpecForge's
// generation-event shape (id, source_id, assistant_turn_index,
// conversations), earlier answers without their reasoning (the history
// as sent with strip_history), the template switches as columns of their
// own (SpecForge passes columns to the template), and nothing else a
// template would receive; the export verifies, and Parquet keeps one row
// per conversation.
func TestSpecForgeProfileRows(t *testing.T) {
	o := Options{Profile: Profile{Trainer: TrainerSpecForge, Switches: []string{"enable_thinking", "thinking"}}}
	sum, lines, dir := exportProfile(t, thinkingRows(t), o)
	if sum.Verified.Records != 2 || len(sum.Verified.Problems) != 0 {
		t.Fatalf("verified %+v", sum.Verified)
	}
	if len(lines) != 3 {
		t.Fatalf("%d rows, want 3 (two turns and one): %q", len(lines), lines)
	}
	wantKeys := []string{"id", "source_id", "assistant_turn_index", "conversations", "tools", "enable_thinking", "thinking"}
	type msg struct {
		Role             string  `json:"role"`
		Content          string  `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	}
	type row struct {
		ID             string `json:"id"`
		SourceID       string `json:"source_id"`
		Index          int    `json:"assistant_turn_index"`
		Conversations  []msg  `json:"conversations"`
		Thinking       any    `json:"thinking"`
		EnableThinking any    `json:"enable_thinking"`
	}
	var got []row
	for _, l := range lines {
		if k := keysInOrder(t, l); !slices.Equal(k, wantKeys) {
			t.Errorf("keys %v, want %v", k, wantKeys)
		}
		if err := CheckShareGPTLine([]byte(l)); err != nil {
			t.Errorf("%v: %s", err, l)
		}
		var r row
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	s := func(v string) *string { return &v }
	wantConv := [][]msg{
		{{"user", "a", nil}, {"assistant", "first", s("why first")}},
		{{"user", "a", nil}, {"assistant", "first", nil}, {"user", "b", nil}, {"assistant", "second", s("why second")}},
		{{"system", "sys", nil}, {"user", "c", nil}, {"assistant", "first", s("why first")}},
	}
	for i, g := range got {
		wantID := []string{"P1/m/turn1", "P1/m/turn2", "P1/s/turn1"}[i]
		wantSource := []string{"P1/m", "P1/m", "P1/s"}[i]
		if g.ID != wantID || g.SourceID != wantSource || g.Index != []int{0, 1, 0}[i] {
			t.Errorf("row %d: id %s source_id %s index %d; want %s %s %d", i, g.ID, g.SourceID, g.Index, wantID, wantSource, []int{0, 1, 0}[i])
		}
		if diff := cmp.Diff(wantConv[i], g.Conversations); diff != "" {
			t.Errorf("row %s conversations (-want +got):\n%s", g.ID, diff)
		}
		if g.Thinking != true || g.EnableThinking != nil {
			t.Errorf("row %s: thinking %v, enable_thinking %v; want true (as requested) and null (not sent)", g.ID, g.Thinking, g.EnableThinking)
		}
	}
	m := readManifest(t, dir, "j")
	if m.Export == nil || m.Export.Trainer != TrainerSpecForge || !slices.Equal(m.Export.Switches, o.Profile.Switches) {
		t.Errorf("manifest export settings %+v; want the SpecForge profile", m.Export)
	}
	for _, f := range m.Files {
		if f.Format == FormatParquet && f.Rows != 2 {
			t.Errorf("Parquet %d rows, want 2 (one per conversation: SpecForge reads no Parquet)", f.Rows)
		}
	}
	card, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"`output.trainer: specforge`", "train_only_last_turn: true", "(2 of the 3 rows here) gets the template's default system prompt", "enable_thinking", "tool_call_id"} {
		if !strings.Contains(string(card), want) {
			t.Errorf("card does not say %q", want)
		}
	}
}

// For gpt-oss the rows take the roles of SpecForge's harmony parser and
// carry no column it would pass to HarmonyParser.parse, which takes no
// extra keyword: id, conversations, tools (and the token fields).
func TestSpecForgeHarmonyRows(t *testing.T) {
	o := Options{Profile: Profile{Trainer: TrainerSpecForge, Harmony: true}}
	sum, lines, _ := exportProfile(t, thinkingRows(t), o)
	if len(sum.Verified.Problems) != 0 || len(lines) != 3 {
		t.Fatalf("%d rows, verified %+v", len(lines), sum.Verified)
	}
	var row struct {
		Conversations []harmonyMessage `json:"conversations"`
	}
	if k := keysInOrder(t, lines[1]); !slices.Equal(k, []string{"id", "conversations", "tools"}) {
		t.Errorf("keys %v, want id, conversations, tools", k)
	}
	if err := json.Unmarshal([]byte(lines[1]), &row); err != nil {
		t.Fatal(err)
	}
	want := []harmonyMessage{{"user", "a"}, {"assistant_final", "first"}, {"user", "b"}, {"assistant_analysis", "why second"}, {"assistant_final", "second"}}
	if diff := cmp.Diff(want, row.Conversations); diff != "" {
		t.Errorf("harmony conversation (-want +got):\n%s", diff)
	}
	tool := turnRow(t, "P1/t", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, "",
		llm.Result{ToolCalls: []llm.ToolCall{call("c1", "f", `{}`)}, FinishReason: "tool_calls", Usage: llm.Usage{PromptTokens: 1, CompletionTokens: 1}})
	_, err := ExportWith(context.Background(), &fakeStore{rows: []store.Row{tool}}, t.TempDir(), []string{FormatShareGPT}, "j", o)
	if err == nil || !strings.Contains(err.Error(), "P1/t") || !strings.Contains(err.Error(), "tool call") {
		t.Errorf("a tool call under harmony roles: %v; want an error naming the sample", err)
	}
}

// The speculators profile is the default layout, byte for byte (it is
// what speculators reads); the manifest and the card name the profile.
func TestSpeculatorsProfileIsTheDefaultLayout(t *testing.T) {
	_, plain, _ := exportProfile(t, thinkingRows(t), Options{})
	_, spec, dir := exportProfile(t, thinkingRows(t), Options{Profile: Profile{Trainer: TrainerSpeculators}})
	if diff := cmp.Diff(plain, spec); diff != "" {
		t.Errorf("speculators rows differ from the default layout (-default +speculators):\n%s", diff)
	}
	if m := readManifest(t, dir, "j"); m.Export == nil || m.Export.Trainer != TrainerSpeculators {
		t.Errorf("manifest export %+v; want trainer speculators", m.Export)
	}
	card, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	if !strings.Contains(string(card), "`output.trainer: speculators`") {
		t.Errorf("card does not name the profile:\n%s", card)
	}
}

// Options the SpecForge profile cannot write are refused before any file.
func TestSpecForgeProfileRefuses(t *testing.T) {
	for _, o := range []Options{
		{Profile: Profile{Trainer: TrainerSpecForge}, Metadata: MetadataFull},
		{Profile: Profile{Trainer: TrainerSpecForge}, TokenIDs: true},
		{Profile: Profile{Trainer: "axolotl"}},
	} {
		dir := t.TempDir()
		if _, err := ExportWith(context.Background(), &fakeStore{rows: thinkingRows(t)}, dir, []string{FormatShareGPT}, "j", o); err == nil {
			t.Errorf("%+v: exported", o)
		}
		if _, err := os.Stat(filepath.Join(dir, DataDir)); err == nil {
			t.Errorf("%+v: left %s behind", o, DataDir)
		}
	}
}

// TestProfileFilesMeetTrainerRules exports a mixed store under every
// trainer profile, with and without token ids, and holds each ShareGPT
// training file (and its no-token-ids file) to the rules of
// testdata/trainers/rules.json that apply to the profile, the Parquet
// files to the rules of every training file; each export verifies.
func TestProfileFilesMeetTrainerRules(t *testing.T) {
	rules := loadTrainerRules(t)
	turn := func(p Profile) Options { return Options{Profile: p, TokenIDs: true, TokenRows: TokenRowsTurn} }
	tests := []struct {
		tag  string
		rows func(*testing.T) []store.Row
		o    Options
	}{
		{"speculators", func(t *testing.T) []store.Row { return trainerStore(t).rows }, Options{Profile: Profile{Trainer: TrainerSpeculators}, TokenIDs: true}},
		{"specforge", func(t *testing.T) []store.Row { return trainerStore(t).rows }, Options{Profile: Profile{Trainer: TrainerSpecForge, Switches: []string{"thinking"}}}},
		{"specforge", func(t *testing.T) []store.Row { return trainerStore(t).rows }, turn(Profile{Trainer: TrainerSpecForge, Switches: []string{"thinking"}})},
		{"specforge-harmony", thinkingRows, Options{Profile: Profile{Trainer: TrainerSpecForge, Harmony: true}}},
		{"specforge-harmony", harmonyTokenRows, turn(Profile{Trainer: TrainerSpecForge, Harmony: true})},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s,token_ids=%v", tt.tag, tt.o.TokenIDs), func(t *testing.T) {
			dir := t.TempDir()
			sum, err := ExportWith(context.Background(), &fakeStore{rows: tt.rows(t)}, dir, []string{FormatShareGPT, FormatParquet}, "j", tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if len(sum.Verified.Problems) != 0 {
				t.Errorf("verify: %v", sum.Verified.Problems)
			}
			checked := 0
			for _, f := range sum.Files {
				var rows []map[string]any
				tag := tt.tag
				switch f.Format {
				case FormatShareGPT, FormatShareGPTNoTokenIDs:
					b, err := os.ReadFile(f.Path)
					if err != nil {
						t.Fatal(err)
					}
					lines := strings.Split(string(bytes.TrimSpace(b)), "\n")
					rows = parseRows(t, lines)
					for i, l := range lines {
						if err := CheckShareGPTLine([]byte(l)); err != nil && tag != "specforge-harmony" {
							t.Errorf("%s line %d: %v", filepath.Base(f.Path), i+1, err)
						}
					}
				case FormatParquet, FormatParquetNoTokenIDs:
					rows, tag = profileParquet(t, f, tt.o), "parquet"
				default:
					continue
				}
				if len(rows) == 0 || len(rows) != f.Rows {
					t.Fatalf("%s: %d rows, manifest %d; want some", f.Path, len(rows), f.Rows)
				}
				checked++
				for _, r := range rules {
					if tag == "parquet" && len(r.Profiles) > 0 || tag != "parquet" && !r.holds(tag) {
						continue
					}
					if err := trainerChecks[r.Rule](rows); err != nil {
						t.Errorf("%s breaks %s (%s: %s; %s): %v", filepath.Base(f.Path), r.Rule, r.Trainer, r.Says, r.Source, err)
					}
				}
			}
			if checked < 2 {
				t.Errorf("%d training files checked, want the ShareGPT and Parquet ones at least", checked)
			}
		})
	}
}

// profileParquet reads a Parquet training file in the schema its options give.
func profileParquet(t *testing.T, f File, o Options) []map[string]any {
	turns := o.TokenIDs && o.TokenRows == TokenRowsTurn
	switch {
	case turns && f.Format == FormatParquetNoTokenIDs:
		return parquetMaps[ParquetTurnNoIDsRow](t, f.Path)
	case turns:
		return parquetMaps[ParquetTurnRow](t, f.Path)
	case o.TokenIDs && f.Format == FormatParquetNoTokenIDs:
		return parquetMaps[ParquetNoIDsRow](t, f.Path)
	case o.TokenIDs:
		return parquetMaps[ParquetTokenRow](t, f.Path)
	}
	return parquetMaps[ParquetRow](t, f.Path)
}

// harmonyTokenRows are thinkingRows with token ids on the two-turn
// conversation (its turns each have a row of ids) and none on the other.
func harmonyTokenRows(t *testing.T) []store.Row {
	rows := thinkingRows(t)
	a0 := answer(ids(1, 2, 3), ids(40, 41))
	a0.Content, a0.ReasoningContent = "first", "why first"
	a1 := answer(ids(1, 2, 3, 40, 2, 9), ids(60, 61))
	a1.Content, a1.ReasoningContent = "second", "why second"
	rows[0].Prior[0].Response, rows[0].Result.Response = result(t, a0), result(t, a1)
	return rows
}

// Under the SpecForge profile the no-token-ids file says why each row has
// no ids, as the default layout does (token_ids: "unavailable: ..."), after
// the columns of a training row: SpecForge run on that file renders the
// text itself and hands the extra column to the chat template as a variable
// no template reads. Harmony rows carry none: HarmonyParser.parse takes no
// extra keyword (rules.json harmony_columns).
func TestSpecForgeNoIDsRowsSayWhy(t *testing.T) {
	turn := func(p Profile) Options { return Options{Profile: p, TokenIDs: true, TokenRows: TokenRowsTurn} }
	for _, tt := range []struct {
		name string
		rows func(*testing.T) []store.Row
		o    Options
		keys []string
		card string
	}{
		{"specforge", func(t *testing.T) []store.Row { return trainerStore(t).rows }, turn(Profile{Trainer: TrainerSpecForge, Switches: []string{"thinking"}}),
			[]string{"id", "source_id", "assistant_turn_index", "conversations", "tools", "thinking", "token_ids"},
			"in `j.sharegpt.no-token-ids.jsonl` (not in this config), with the same keys and `token_ids` (why)"},
		{"specforge-harmony", harmonyTokenRows, turn(Profile{Trainer: TrainerSpecForge, Harmony: true}), []string{"id", "conversations", "tools"},
			"(not in this config), with neither `input_ids` and `loss_mask` nor the reason"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			sum, err := ExportWith(context.Background(), &fakeStore{rows: tt.rows(t)}, dir, []string{FormatShareGPT}, "j", tt.o)
			if err != nil {
				t.Fatal(err)
			}
			card, err := os.ReadFile(filepath.Join(dir, "README.md"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(card), tt.card) {
				t.Errorf("card does not say %q", tt.card)
			}
			var lines []string
			for _, f := range sum.Files {
				if f.Format == FormatShareGPTNoTokenIDs {
					b, err := os.ReadFile(f.Path)
					if err != nil {
						t.Fatal(err)
					}
					lines = strings.Split(string(bytes.TrimSpace(b)), "\n")
				}
			}
			if len(lines) == 0 || lines[0] == "" {
				t.Fatalf("no rows in the no-token-ids file (files %+v)", sum.Files)
			}
			for _, l := range lines {
				if k := keysInOrder(t, l); !slices.Equal(k, tt.keys) {
					t.Errorf("keys %v, want %v: %s", k, tt.keys, l)
				}
				var row struct {
					TokenIDs *string `json:"token_ids"`
				}
				if err := json.Unmarshal([]byte(l), &row); err != nil {
					t.Fatal(err)
				}
				if slices.Contains(tt.keys, "token_ids") && (row.TokenIDs == nil || !strings.HasPrefix(*row.TokenIDs, "unavailable: ")) {
					t.Errorf("token_ids %v, want the reason (unavailable: ...): %s", row.TokenIDs, l)
				}
			}
		})
	}
}
