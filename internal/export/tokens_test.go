package export

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
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
			want: tokenSeq{Missing: "unavailable: turn 2's prompt does not start with turn 1's prompt and answer as generated (the history re-renders it, e.g. reasoning left out)"},
		},
		{
			name: "earlier prompt changed",
			answers: []llm.Result{
				answer(ids(1, 2), ids(40)),
				answer(ids(1, 3, 40, 5), ids(60)),
			},
			want: tokenSeq{Missing: "unavailable: turn 2's prompt does not start with turn 1's prompt and answer as generated (the history re-renders it, e.g. reasoning left out)"},
		},
		{
			name:    "engine without ids",
			answers: []llm.Result{answer(ids(1), ids(2)), {Content: "x", Usage: llm.Usage{PromptTokens: 3, CompletionTokens: 1}}},
			want:    tokenSeq{Missing: "unavailable: llamacpp (turn 2 has no token ids)"},
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
	got := map[string]view{}
	for _, m := range readLines(t, filepath.Join(dir, "j.sharegpt.jsonl")) {
		b, _ := json.Marshal(m)
		var v view
		json.Unmarshal(b, &v)
		got[m["id"].(string)] = v
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sharegpt token fields (-want +got):\n%s", diff)
	}
	rows, err := parquet.ReadFile[ParquetTokenRow](filepath.Join(dir, "j.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	gotPQ := map[string]view{}
	for _, r := range rows {
		v := view{InputIDs: r.InputIDs, LossMask: r.LossMask}
		if r.TokenIDs != nil {
			v.TokenIDs = *r.TokenIDs
		}
		gotPQ[r.ID] = v
	}
	if diff := cmp.Diff(want, gotPQ, cmp.Comparer(func(a, b []int32) bool { return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b)) }),
		cmp.Comparer(func(a, b []int8) bool { return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b)) })); diff != "" {
		t.Errorf("parquet token columns (-want +got):\n%s", diff)
	}

	// Off (the default): no token field in either file.
	off := t.TempDir()
	if _, err := ExportWith(context.Background(), fs, off, []string{FormatShareGPT, FormatParquet}, "j", Options{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(off, "j.manifest.json")); strings.Contains(string(b), "token_ids") {
		t.Errorf("manifest counts token ids with token_ids off")
	}
	for _, m := range readLines(t, filepath.Join(off, "j.sharegpt.jsonl")) {
		for _, k := range []string{"input_ids", "loss_mask", "token_ids"} {
			if _, ok := m[k]; ok {
				t.Errorf("%s has %s with token_ids off", m["id"], k)
			}
		}
	}
	pf, err := parquet.ReadFile[ParquetRow](filepath.Join(off, "j.parquet"))
	if err != nil || len(pf) != 3 {
		t.Fatalf("parquet without token ids: %d rows, %v", len(pf), err)
	}
	schema := parquetSchema(t, filepath.Join(off, "j.parquet"))
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
