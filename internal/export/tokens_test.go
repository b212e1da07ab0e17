package export

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// ids is a token-id literal for the tests.
func ids(v ...int32) []int32 { return v }

func answer(prompt, completion []int32) llm.Result {
	return llm.Result{Content: "text the ids have nothing to do with", FinishReason: "stop",
		PromptTokenIDs: prompt, CompletionTokenIDs: completion,
		Usage: llm.Usage{PromptTokens: len(prompt), CompletionTokens: len(completion)}}
}

// TestTokenSequence: the last prompt plus the last answer, the mask on
// every turn's answer at the offset the earlier prompt's length gives, and
// a reason instead whenever the server's ids do not line up. The ids are
// unrelated to the answers' text, so the result can only come from the
// server's ids: nothing is tokenized or decoded.
func TestTokenSequence(t *testing.T) {
	engine := func(k int) string { return []string{"vllm", "llamacpp"}[k%2] }
	tests := []struct {
		name    string
		answers []llm.Result
		want    tokenSeq
	}{
		{
			name:    "one turn",
			answers: []llm.Result{answer(ids(7, 8, 9), ids(500, 501))},
			want:    tokenSeq{InputIDs: ids(7, 8, 9, 500, 501), LossMask: []int8{0, 0, 0, 1, 1}},
		},
		{
			name: "two turns, append-only template",
			answers: []llm.Result{
				answer(ids(1, 2, 3), ids(40, 41)),
				answer(ids(1, 2, 3, 40, 41, 2, 9, 9, 3), ids(60, 61, 62)),
			},
			want: tokenSeq{InputIDs: ids(1, 2, 3, 40, 41, 2, 9, 9, 3, 60, 61, 62), LossMask: []int8{0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1}},
		},
		{
			name: "three turns",
			answers: []llm.Result{
				answer(ids(1), ids(10)),
				answer(ids(1, 10, 2), ids(20, 21)),
				answer(ids(1, 10, 2, 20, 21, 3), ids(30)),
			},
			want: tokenSeq{InputIDs: ids(1, 10, 2, 20, 21, 3, 30), LossMask: []int8{0, 1, 0, 1, 1, 0, 1}},
		},
		{
			name: "history re-rendered",
			answers: []llm.Result{
				answer(ids(1, 2), ids(40, 41, 42)), // 40 is reasoning the history leaves out
				answer(ids(1, 2, 41, 42, 5), ids(60)),
			},
			want: tokenSeq{Missing: "unavailable: turn 2's prompt does not start with turn 1's prompt and answer as generated (the history re-renders it, e.g. reasoning left out): output.token_rows: turn exports this conversation"},
		},
		{
			name: "earlier prompt changed",
			answers: []llm.Result{
				answer(ids(1, 2), ids(40)),
				answer(ids(1, 3, 40, 5), ids(60)),
			},
			want: tokenSeq{Missing: "unavailable: turn 2's prompt does not start with turn 1's prompt and answer as generated (the history re-renders it, e.g. reasoning left out): output.token_rows: turn exports this conversation"},
		},
		{
			name:    "engine without ids",
			answers: []llm.Result{answer(ids(1), ids(2)), {Content: "x", Usage: llm.Usage{PromptTokens: 3, CompletionTokens: 1}}},
			want:    tokenSeq{Missing: "unavailable: llamacpp (turn 2 has no token ids)"},
		},
		{
			name: "ids found wrong after the answer",
			answers: []llm.Result{answer(ids(1), ids(10)), func() llm.Result {
				a := answer(ids(1, 10, 2), ids(20))
				a.TokenIDsUnavailable = "turn 2's prompt ids differ from the server's render at index 2"
				return a
			}()},
			want: tokenSeq{Missing: "unavailable: turn 2's prompt ids differ from the server's render at index 2"},
		},
		{
			name: "fewer ids than completion tokens",
			answers: []llm.Result{{PromptTokenIDs: ids(1), CompletionTokenIDs: ids(2, 3),
				Usage: llm.Usage{PromptTokens: 1, CompletionTokens: 3}}},
			want: tokenSeq{Missing: "unavailable: turn 1 has 2 completion ids for 3 completion tokens"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tokenSequence(tt.answers, engine)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("tokenSequence (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExportTokenIDs writes a multi-turn, a single-turn and an engine
// without ids through ShareGPT and Parquet: the same ids and mask in both,
// the reason where there are none, the counts in the summary, and no token
// columns at all when the option is off.
func TestExportTokenIDs(t *testing.T) {
	multi := `{"messages":[{"role":"user","content":"a"}],"turns":[{"input":[{"role":"user","content":"b"}]}]}`
	t0 := answer(ids(1, 2, 3), ids(40, 41))
	t1 := answer(ids(1, 2, 3, 40, 41, 2, 9, 3), ids(60, 61, 62))
	row := doneRow(t, "P1/m", multi, t1)
	row.Result.Turn = 1
	row.Prior = []store.Result{{Response: result(t, t0), FinishReason: "stop", PromptTokens: 3, CompletionTokens: 2, Endpoint: "http://a:1", Lane: "short"}}
	noIDs := doneRow(t, "P1/n", `{"messages":[{"role":"user","content":"c"}]}`, llm.Result{Content: "z", FinishReason: "stop", Usage: llm.Usage{PromptTokens: 2, CompletionTokens: 1}})
	noIDs.Result.Endpoint = "http://llama:8080"
	fs := &fakeStore{rows: []store.Row{row, noIDs, doneRow(t, "P1/s", `{"messages":[{"role":"user","content":"d"}]}`, answer(ids(5, 6), ids(7)))}}
	engineOf := func(url string) string {
		if url == "http://llama:8080" {
			return "llamacpp"
		}
		return "vllm"
	}
	dir := t.TempDir()
	sum, err := ExportWith(context.Background(), fs, dir, []string{FormatShareGPT, FormatParquet}, "j", Options{TokenIDs: true, EngineOf: engineOf})
	if err != nil {
		t.Fatal(err)
	}
	if sum.TokenIDs != 2 || sum.TokenIDsUnavailable != 1 {
		t.Errorf("summary token ids %d, unavailable %d; want 2 and 1", sum.TokenIDs, sum.TokenIDsUnavailable)
	}
	var man Manifest
	b, err := os.ReadFile(filepath.Join(dir, "j.manifest.json"))
	if err != nil || json.Unmarshal(b, &man) != nil {
		t.Fatalf("manifest: %v\n%s", err, b)
	}
	if diff := cmp.Diff(&TokenIDCounts{With: 2, Unavailable: 1}, man.Totals.TokenIDs); diff != "" {
		t.Errorf("manifest totals.token_ids (-want +got):\n%s", diff)
	}
	card, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Conversations without token ids: 1, in `j.sharegpt.no-token-ids.jsonl`", "| `j.sharegpt.no-token-ids.jsonl` | sharegpt-no-token-ids | 1 |",
		"Conversations without token ids: 1, in `j.no-token-ids.parquet`", "| `j.no-token-ids.parquet` | parquet-no-token-ids | 1 |"} {
		if !strings.Contains(string(card), want) {
			t.Errorf("card does not say %q:\n%s", want, card)
		}
	}
	var listed bool
	for _, f := range man.Files {
		listed = listed || f.Path == "j.sharegpt.no-token-ids.jsonl" && f.Rows == 1 && f.Format == FormatShareGPTNoTokenIDs
	}
	if !listed {
		t.Errorf("manifest files %+v: want j.sharegpt.no-token-ids.jsonl with 1 row", man.Files)
	}
	type view struct {
		InputIDs []int32 `json:"input_ids"`
		LossMask []int8  `json:"loss_mask"`
		TokenIDs string  `json:"token_ids"`
	}
	want := map[string]view{
		"P1/m": {InputIDs: ids(1, 2, 3, 40, 41, 2, 9, 3, 60, 61, 62), LossMask: []int8{0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1}},
		"P1/n": {TokenIDs: "unavailable: llamacpp (turn 1 has no token ids)"},
		"P1/s": {InputIDs: ids(5, 6, 7), LossMask: []int8{0, 0, 1}},
	}
	// The rows without ids are in a file of their own: each file is
	// all-ids or no-ids.
	got := map[string]view{}
	for file, keys := range map[string][]string{"data/j.sharegpt.jsonl": {"input_ids", "loss_mask"}, "j.sharegpt.no-token-ids.jsonl": {"token_ids"}} {
		for _, m := range readLines(t, filepath.Join(dir, file)) {
			var has []string
			for _, k := range []string{"input_ids", "loss_mask", "token_ids"} {
				if _, ok := m[k]; ok {
					has = append(has, k)
				}
			}
			if !slices.Equal(has, keys) {
				t.Errorf("%s: %s has token keys %v, want %v", file, m["id"], has, keys)
			}
			b, _ := json.Marshal(m)
			var v view
			json.Unmarshal(b, &v)
			got[m["id"].(string)] = v
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sharegpt token fields (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]File{
		{Format: FormatShareGPT, Path: filepath.Join(dir, DataDir, "j.sharegpt.jsonl"), Rows: 2},
		{Format: FormatShareGPTNoTokenIDs, Path: filepath.Join(dir, "j.sharegpt.no-token-ids.jsonl"), Rows: 1},
	}, sum.Files[:2]); diff != "" {
		t.Errorf("summary files (-want +got):\n%s", diff)
	}
	rows, err := parquet.ReadFile[ParquetTokenRow](filepath.Join(dir, DataDir, "j.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	gotPQ := map[string]view{}
	for _, r := range rows {
		if r.TokenIDs != nil || len(r.InputIDs) == 0 {
			t.Errorf("j.parquet: %s has %d ids, token_ids %v; want ids on every row", r.ID, len(r.InputIDs), r.TokenIDs)
		}
		gotPQ[r.ID] = view{InputIDs: r.InputIDs, LossMask: r.LossMask}
	}
	// Parquet too is all-ids or no-ids: the rows without are apart, with
	// no input_ids or loss_mask column.
	side := filepath.Join(dir, "j.no-token-ids.parquet")
	if schema := parquetSchema(t, side); strings.Contains(schema, "input_ids") || strings.Contains(schema, "loss_mask") {
		t.Errorf("j.no-token-ids.parquet has token columns:\n%s", schema)
	}
	sideRows, err := parquet.ReadFile[ParquetNoIDsRow](side)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sideRows {
		if r.TokenIDs != nil {
			gotPQ[r.ID] = view{TokenIDs: *r.TokenIDs}
		}
	}
	if diff := cmp.Diff(want, gotPQ, cmp.Comparer(func(a, b []int32) bool { return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b)) }),
		cmp.Comparer(func(a, b []int8) bool { return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b)) })); diff != "" {
		t.Errorf("parquet token columns (-want +got):\n%s", diff)
	}

	// Verify reads the no-token-ids Parquet row by row: the ids file put in
	// its place is caught by its rows, not only by its checksum.
	pqBytes, err := os.ReadFile(filepath.Join(dir, DataDir, "j.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(side, pqBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(context.Background(), fs, dir, "j", Options{EngineOf: engineOf})
	if err != nil {
		t.Fatal(err)
	}
	var rowProblem bool
	for _, p := range rep.Problems {
		rowProblem = rowProblem || p.Path == "j.no-token-ids.parquet" && p.Line == 1
	}
	if !rowProblem {
		t.Errorf("Verify with the ids file in place of j.no-token-ids.parquet: %v; want a problem at its row 1", rep.Problems)
	}

	// Off (the default): no token field in either file.
	off := t.TempDir()
	if _, err := ExportWith(context.Background(), fs, off, []string{FormatShareGPT, FormatParquet}, "j", Options{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(off, "j.manifest.json")); strings.Contains(string(b), "token_ids") {
		t.Errorf("manifest counts token ids with token_ids off")
	}
	if _, err := os.Stat(filepath.Join(off, "j.sharegpt.no-token-ids.jsonl")); !os.IsNotExist(err) {
		t.Errorf("no-token-ids file with token_ids off: %v", err)
	}
	for _, m := range readLines(t, filepath.Join(off, DataDir, "j.sharegpt.jsonl")) {
		for _, k := range []string{"input_ids", "loss_mask", "token_ids"} {
			if _, ok := m[k]; ok {
				t.Errorf("%s has %s with token_ids off", m["id"], k)
			}
		}
	}
	// Exported again without ids into the folder that had them: the side
	// file goes, and the export verifies (no file left out of the manifest).
	if _, err := ExportWith(context.Background(), fs, dir, []string{FormatShareGPT, FormatParquet}, "j", Options{}); err != nil {
		t.Fatalf("export without ids over an export with them: %v", err)
	}
	for _, f := range []string{"j.sharegpt.no-token-ids.jsonl", "j.no-token-ids.parquet"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("stale %s after an export without ids: %v", f, err)
		}
	}
	pf, err := parquet.ReadFile[ParquetRow](filepath.Join(off, DataDir, "j.parquet"))
	if err != nil || len(pf) != 3 {
		t.Fatalf("parquet without token ids: %d rows, %v", len(pf), err)
	}
	schema := parquetSchema(t, filepath.Join(off, DataDir, "j.parquet"))
	if strings.Contains(schema, "input_ids") || strings.Contains(schema, "loss_mask") {
		t.Errorf("token columns with token_ids off:\n%s", schema)
	}
}

func parquetSchema(t *testing.T, path string) string {
	t.Helper()
	return openParquet(t, path).Schema().String()
}

// openParquet opens a Parquet file for its schema and metadata.
func openParquet(t *testing.T, path string) *parquet.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return pf
}
