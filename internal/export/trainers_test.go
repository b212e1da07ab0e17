package export

import (
	"bytes"
	stdcmp "cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/store"
)

// trainerRule is one rule a trainer's loader holds a training file to,
// with the loader's source line (testdata/trainers/rules.json, from
// TRAINERS.md) and lines that break it.
type trainerRule struct {
	Rule    string   `json:"rule"`
	Trainer string   `json:"trainer"`
	Source  string   `json:"source"`
	Says    string   `json:"says"`
	Bad     []string `json:"bad"`
	// Profiles are the output.trainer profiles whose ShareGPT training
	// files the rule holds ("" the default layout; specforge-harmony the
	// SpecForge profile for gpt-oss); none: every training file.
	Profiles []string `json:"profiles"`
}

// holds reports whether the rule applies to a ShareGPT file of profile.
func (r trainerRule) holds(profile string) bool {
	return len(r.Profiles) == 0 || slices.Contains(r.Profiles, profile)
}

// trainerChecks check a whole training file (its lines, parsed) against
// one rule; the rules' names are those of rules.json.
var trainerChecks = map[string]func(rows []map[string]any) error{
	"same_keys":                sameKeys,
	"tools_on_every_row":       toolsOnEveryRow,
	"content_is_text":          contentIsText,
	"token_fields_all_or_none": tokenFieldsAllOrNone,
	"conversations_column":     conversationsColumn,
	"specforge_turn_rows":      specForgeTurnRows,
	"no_argument_columns":      noArgumentColumns,
	"harmony_columns":          harmonyColumns,
	"harmony_roles":            rolesAmong("system", "assistant_reasoning_effort", "user", "assistant_analysis", "assistant_commentary", "assistant_final"),
	"speculators_roles":        rolesAmong("system", "user", "assistant", "tool"),
}

// specForgeTurnRows: a row is one assistant turn, holding
// assistant_turn_index earlier answers and ending with its own.
func specForgeTurnRows(rows []map[string]any) error {
	for i, r := range rows {
		k, ok := r["assistant_turn_index"].(float64)
		if !ok {
			if _, harmony := r["source_id"]; harmony {
				return fmt.Errorf("row %d: no assistant_turn_index", i+1)
			}
			k = -1 // a harmony row: counted by its finals alone
		}
		conv, _ := r["conversations"].([]any)
		answers := 0
		for _, m := range conv {
			if role := m.(map[string]any)["role"]; role == "assistant" || role == "assistant_final" {
				answers++
			}
		}
		if last, _ := conv[len(conv)-1].(map[string]any); last["role"] != "assistant" && last["role"] != "assistant_final" {
			return fmt.Errorf("row %d: ends with %v, not its turn's answer", i+1, last["role"])
		}
		if k >= 0 && answers != int(k)+1 {
			return fmt.Errorf("row %d: %d answers for assistant_turn_index %v: not one turn", i+1, answers, k)
		}
	}
	return nil
}

// argumentNames are Parser.parse's and apply_chat_template's arguments.
var argumentNames = []string{"conversation", "max_length", "preformatted", "train_only_last_turn", "tool",
	"messages", "tokenize", "add_generation_prompt", "add_special_tokens"}

func noArgumentColumns(rows []map[string]any) error {
	for i, r := range rows {
		for k := range r {
			if slices.Contains(argumentNames, k) {
				return fmt.Errorf("row %d: column %q is an argument of SpecForge's parser", i+1, k)
			}
		}
	}
	return nil
}

func harmonyColumns(rows []map[string]any) error {
	for i, r := range rows {
		for k := range r {
			if !slices.Contains([]string{"id", "conversations", "tools", "input_ids", "loss_mask"}, k) {
				return fmt.Errorf("row %d: column %q, which HarmonyParser.parse does not take", i+1, k)
			}
		}
	}
	return nil
}

func rolesAmong(roles ...string) func([]map[string]any) error {
	return func(rows []map[string]any) error {
		for i, r := range rows {
			conv, _ := r["conversations"].([]any)
			for j, m := range conv {
				if role, _ := m.(map[string]any)["role"].(string); !slices.Contains(roles, role) {
					return fmt.Errorf("row %d: conversations[%d].role %q, want one of %v", i+1, j, role, roles)
				}
			}
		}
		return nil
	}
}

func conversationsColumn(rows []map[string]any) error {
	for i, r := range rows {
		conv, ok := r["conversations"].([]any)
		if !ok || len(conv) == 0 {
			return fmt.Errorf("row %d: no conversations list", i+1)
		}
		if last, _ := conv[len(conv)-1].(map[string]any); last["role"] != "assistant" && last["role"] != "assistant_final" {
			return fmt.Errorf("row %d: conversations end with %v, want the assistant's answer", i+1, last["role"])
		}
	}
	return nil
}

// parquetMaps reads a Parquet export as maps keyed by column name, the
// way a trainer's loader sees it: T is the file's row type (ParquetRow, or
// ParquetTokenRow with token ids).
func parquetMaps[T any](t *testing.T, path string) []map[string]any {
	t.Helper()
	rows, err := parquet.ReadFile[T](path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, r := range rows {
		m := map[string]any{}
		columns(reflect.ValueOf(r), m)
		out = append(out, m)
	}
	return out
}

// columns puts a row struct's fields into m by their Parquet names.
func columns(v reflect.Value, m map[string]any) {
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Anonymous {
			columns(v.Field(i), m)
			continue
		}
		m[parquetName(f)] = columnValue(v.Field(i))
	}
}

func columnValue(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return columnValue(v.Elem())
	case reflect.Slice:
		if v.IsNil() && v.Type().Elem().Kind() == reflect.Struct {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = columnValue(v.Index(i))
		}
		return out
	case reflect.Struct:
		m := map[string]any{}
		columns(v, m)
		return m
	}
	return v.Interface()
}

// sameKeys: every object at one place of the rows (the row, a message, a
// tool call, a turn's usage...) has the same keys, all through the file.
func sameKeys(rows []map[string]any) error {
	seen := map[string][]string{}
	var walk func(path string, v any, row int) error
	walk = func(path string, v any, row int) error {
		switch x := v.(type) {
		case map[string]any:
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range x {
					if !yield(k) {
						return
					}
				}
			})
			if first, ok := seen[path]; ok && !slices.Equal(first, keys) {
				return fmt.Errorf("row %d: %s has keys %v, an earlier one %v", row+1, path, keys, first)
			}
			seen[path] = keys
			for _, k := range keys {
				if err := walk(path+"."+k, x[k], row); err != nil {
					return err
				}
			}
		case []any:
			for _, e := range x {
				if err := walk(path+"[]", e, row); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for i, r := range rows {
		if err := walk("row", r, i); err != nil {
			return err
		}
	}
	return nil
}

func toolsOnEveryRow(rows []map[string]any) error {
	for i, r := range rows {
		var list []any
		switch t := r["tools"].(type) {
		case []any:
			list = t
		case string:
			if err := json.Unmarshal([]byte(t), &list); err != nil || list == nil {
				return fmt.Errorf("row %d: tools %q is not a JSON list", i+1, t)
			}
		default:
			return fmt.Errorf("row %d: tools is %T, want a list or a JSON string of one", i+1, t)
		}
	}
	return nil
}

func contentIsText(rows []map[string]any) error {
	for i, r := range rows {
		conv, _ := r["conversations"].([]any)
		for j, m := range conv {
			if _, ok := m.(map[string]any)["content"].(string); !ok {
				return fmt.Errorf("row %d: conversations[%d].content is not a string", i+1, j)
			}
		}
	}
	return nil
}

func tokenFieldsAllOrNone(rows []map[string]any) error {
	with := 0
	for i, r := range rows {
		ids, a := r["input_ids"].([]any)
		mask, b := r["loss_mask"].([]any)
		switch {
		case a && b && len(ids) == len(mask) && len(ids) > 0:
			with++
		case r["input_ids"] != nil || r["loss_mask"] != nil || a || b:
			return fmt.Errorf("row %d: input_ids %d, loss_mask %d: want both of one length", i+1, len(ids), len(mask))
		}
	}
	if with != 0 && with != len(rows) {
		return fmt.Errorf("%d of %d rows have input_ids and loss_mask: want all or none", with, len(rows))
	}
	return nil
}

func loadTrainerRules(t *testing.T) []trainerRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "trainers", "rules.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []trainerRule
	if err := json.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	return rules
}

func parseRows(t *testing.T, lines []string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		rows = append(rows, m)
	}
	return rows
}

// TestTrainerRulesCatchTheirCase shows each rule's check rejecting the
// lines its fixture says the trainer fails on, and every rule of the
// fixture having a check.
func TestTrainerRulesCatchTheirCase(t *testing.T) {
	for _, r := range loadTrainerRules(t) {
		check := trainerChecks[r.Rule]
		if check == nil || r.Source == "" || len(r.Bad) == 0 {
			t.Errorf("rule %q (%s): want a check, a source line and bad lines", r.Rule, r.Trainer)
			continue
		}
		if err := check(parseRows(t, r.Bad)); err == nil {
			t.Errorf("%s (%s, %s): the check passes the lines the trainer fails on", r.Rule, r.Trainer, r.Source)
		}
	}
}

// trainerStore mixes what a real job has: rows with and without tools,
// content parts, a tool round trip, a truncated answer, multi-turn rows,
// and token ids present on some rows and unavailable on others.
func trainerStore(t *testing.T) *fakeStore {
	fs := fixture(t)
	multi := `{"messages":[{"role":"user","content":"a"}],"turns":[{"input":[{"role":"user","content":"b"}]}]}`
	t0 := answer(ids(1, 2, 3), ids(40, 41))
	t1 := answer(ids(1, 2, 3, 40, 41, 2, 9, 3), ids(60, 61, 62))
	row := doneRow(t, "P1/m", multi, t1)
	row.Result.Turn = 1
	row.Prior = []store.Result{{Response: result(t, t0), FinishReason: "stop", PromptTokens: 3, CompletionTokens: 2, Endpoint: "http://a:1", Lane: "short"}}
	withIDs := doneRow(t, "P1/s", `{"messages":[{"role":"user","content":"d"}],"tools":[{"type":"function","function":{"name":"g"}}]}`, answer(ids(5, 6), ids(7)))
	fs.rows = append([]store.Row{row, withIDs}, fs.rows...)
	return fs
}

// TestTrainingFilesMeetTrainerRules exports a mixed store with every
// metadata and token-id setting and holds every training file (ShareGPT
// and Parquet) to every trainer rule of testdata/trainers/rules.json.
func TestTrainingFilesMeetTrainerRules(t *testing.T) {
	rules := loadTrainerRules(t)
	for _, o := range []Options{{}, {Metadata: MetadataFull}, {TokenIDs: true}, {Metadata: MetadataFull, TokenIDs: true}} {
		t.Run(fmt.Sprintf("%s,token_ids=%v", stdcmp.Or(o.Metadata, MetadataMinimal), o.TokenIDs), func(t *testing.T) {
			dir := t.TempDir()
			sum, err := ExportWith(context.Background(), trainerStore(t), dir, []string{FormatShareGPT, FormatParquet}, "j", o)
			if err != nil {
				t.Fatal(err)
			}
			var files int
			jsonConv, pqConv := map[string]any{}, map[string]any{}
			for _, f := range sum.Files {
				if f.Format == FormatParquet || f.Format == FormatParquetNoTokenIDs || f.Format == FormatParquetTruncated {
					rows := parquetMaps[ParquetRow](t, f.Path)
					switch {
					case f.Format == FormatParquetNoTokenIDs:
						rows = parquetMaps[ParquetNoIDsRow](t, f.Path)
					case o.TokenIDs:
						rows = parquetMaps[ParquetTokenRow](t, f.Path)
					}
					for _, r := range rows {
						pqConv[r["id"].(string)] = r["conversations"]
					}
					for _, r := range rules {
						if f.Format == FormatParquetTruncated || len(r.Profiles) > 0 {
							continue // not a training file; a rule of a profile's ShareGPT file
						}
						if err := trainerChecks[r.Rule](rows); err != nil {
							t.Errorf("%s breaks %s (%s: %s; %s): %v", filepath.Base(f.Path), r.Rule, r.Trainer, r.Says, r.Source, err)
						}
					}
					continue
				}
				if f.Format != FormatShareGPT && f.Format != FormatShareGPTNoTokenIDs && f.Format != FormatShareGPTTruncated {
					continue
				}
				files++
				b, err := os.ReadFile(f.Path)
				if err != nil {
					t.Fatal(err)
				}
				rows := parseRows(t, strings.Split(string(bytes.TrimSpace(b)), "\n"))
				for _, r := range rows {
					jsonConv[r["id"].(string)] = r["conversations"]
				}
				if len(rows) == 0 || len(rows) != f.Rows {
					t.Fatalf("%s: %d rows, manifest %d; want some", f.Path, len(rows), f.Rows)
				}
				for _, r := range rules {
					if f.Format == FormatShareGPTTruncated || !r.holds("") {
						continue // not a training file; a rule of another profile
					}
					if err := trainerChecks[r.Rule](rows); err != nil {
						t.Errorf("%s breaks %s (%s: %s; %s): %v", filepath.Base(f.Path), r.Rule, r.Trainer, r.Says, r.Source, err)
					}
				}
				for i, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
					if err := CheckShareGPTLine(line); err != nil {
						t.Errorf("%s line %d: %v", filepath.Base(f.Path), i+1, err)
					}
				}
			}
			// Parquet holds the ShareGPT file's conversations, message for message.
			if diff := cmp.Diff(jsonConv, pqConv); diff != "" || len(pqConv) != sum.Done {
				t.Errorf("Parquet conversations (%d) differ from the ShareGPT files' (-jsonl +parquet):\n%s", len(pqConv), diff)
			}
			// The training file, the truncated one, and with ids the no-ids one.
			if want := map[bool]int{false: 2, true: 3}[o.TokenIDs]; files != want {
				t.Errorf("%d ShareGPT files, want %d", files, want)
			}
			if o.TokenIDs && (sum.TokenIDs != 2 || sum.TokenIDsUnavailable != 3) {
				t.Errorf("token ids %d, unavailable %d; want 2 and 3", sum.TokenIDs, sum.TokenIDsUnavailable)
			}
		})
	}
}
