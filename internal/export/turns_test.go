package export

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/store"
)

// turnView is what TestExportTurnRows compares of a row.
type turnView struct {
	ConversationID string  `json:"conversation_id"`
	Turn           int     `json:"turn"`
	Messages       int     `json:"-"`
	Reasoning      any     `json:"-"` // the first answer's reasoning_content
	InputIDs       []int32 `json:"input_ids"`
	LossMask       []int8  `json:"loss_mask"`
	TokenIDs       string  `json:"token_ids"`
}

// TestExportTurnRows exports a conversation whose second prompt leaves the
// first answer's reasoning out (the ids do not line up), one whose first
// turn has no ids and a single turn as turn rows: one row per answer with
// that turn's prompt ids then its completion ids, loss on the completion,
// the conversation up to that answer, rows without ids apart; the same in
// Parquet, counted in the manifest, and Verify passes, then catches a
// changed turn row.
func TestExportTurnRows(t *testing.T) {
	multi := `{"messages":[{"role":"user","content":"a"}],"turns":[{"input":[{"role":"user","content":"b"}]}]}`
	t0 := answer(ids(1, 2, 3), ids(40, 41)) // 40 is reasoning the next prompt leaves out
	t0.ReasoningContent = "r0"
	t1 := answer(ids(1, 2, 3, 41, 2, 9, 3), ids(60, 61, 62))
	prior := func(res []byte) []store.Result {
		return []store.Result{{Response: res, FinishReason: "stop", PromptTokens: 3, CompletionTokens: 2, Endpoint: "http://a:1", Lane: "short", Attempts: 1}}
	}
	m := doneRow(t, "P1/m", multi, t1)
	m.Result.Turn, m.Prior = 1, prior(result(t, t0))
	n := doneRow(t, "P1/n", multi, t1)
	n.Result.Turn, n.Prior = 1, prior(result(t, answer(nil, nil)))
	fs := &fakeStore{rows: []store.Row{m, n, doneRow(t, "P1/s", `{"messages":[{"role":"user","content":"d"}]}`, answer(ids(5, 6), ids(7)))}}
	dir := t.TempDir()
	o := Options{TokenIDs: true, TokenRows: TokenRowsTurn, Metadata: MetadataFull, EngineOf: func(string) string { return "vllm" }}
	sum, err := ExportWith(context.Background(), fs, dir, []string{FormatShareGPT, FormatParquet}, "j", o)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]turnView{
		"P1/m/turn1": {ConversationID: "P1/m", Turn: 1, Messages: 2, Reasoning: "r0", InputIDs: ids(1, 2, 3, 40, 41), LossMask: []int8{0, 0, 0, 1, 1}},
		"P1/m/turn2": {ConversationID: "P1/m", Turn: 2, Messages: 4, InputIDs: ids(1, 2, 3, 41, 2, 9, 3, 60, 61, 62), LossMask: []int8{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}},
		"P1/n/turn1": {ConversationID: "P1/n", Turn: 1, Messages: 2, TokenIDs: "unavailable: vllm (turn 1 has no token ids)"},
		"P1/n/turn2": {ConversationID: "P1/n", Turn: 2, Messages: 4, InputIDs: ids(1, 2, 3, 41, 2, 9, 3, 60, 61, 62), LossMask: []int8{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}},
		"P1/s/turn1": {ConversationID: "P1/s", Turn: 1, Messages: 2, InputIDs: ids(5, 6, 7), LossMask: []int8{0, 0, 1}},
	}
	got := map[string]turnView{}
	for _, file := range []string{"data/j.sharegpt.jsonl", "j.sharegpt.no-token-ids.jsonl"} {
		for _, l := range readLines(t, filepath.Join(dir, file)) {
			b, _ := json.Marshal(l)
			var v turnView
			json.Unmarshal(b, &v)
			msgs := l["conversations"].([]any)
			v.Messages, v.Reasoning = len(msgs), msgs[1].(map[string]any)["reasoning_content"]
			got[l["id"].(string)] = v
			if (file == "data/j.sharegpt.jsonl") != (v.TokenIDs == "") {
				t.Errorf("%s in %s with token_ids %q", l["id"], file, v.TokenIDs)
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("turn rows (-want +got):\n%s", diff)
	}
	if sum.TokenIDs != 4 || sum.TokenIDsUnavailable != 1 {
		t.Errorf("summary: %d rows with ids, %d without; want 4 and 1", sum.TokenIDs, sum.TokenIDsUnavailable)
	}
	var man Manifest
	b, _ := os.ReadFile(filepath.Join(dir, "j.manifest.json"))
	if err := json.Unmarshal(b, &man); err != nil || man.Export.TokenRows != TokenRowsTurn || *man.Totals.TokenIDs != (TokenIDCounts{With: 4, Unavailable: 1}) {
		t.Errorf("manifest export %+v totals %+v (%v); want token_rows turn, 4 with and 1 without", man.Export, man.Totals.TokenIDs, err)
	}
	rows, err := parquet.ReadFile[ParquetTurnRow](filepath.Join(dir, DataDir, "j.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		w := want[r.ID]
		if r.ConversationID != w.ConversationID || int(r.Turn) != w.Turn || !cmp.Equal(r.InputIDs, w.InputIDs) || !cmp.Equal(r.LossMask, w.LossMask) {
			t.Errorf("parquet %s: %s turn %d ids %v mask %v; want %+v", r.ID, r.ConversationID, r.Turn, r.InputIDs, r.LossMask, w)
		}
	}
	if len(rows) != 4 {
		t.Errorf("parquet: %d turn rows with ids, want 4", len(rows))
	}

	card, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	for _, w := range []string{"Turn rows with token ids: 4; without: 1.", "`conversation_id` string, `turn` int64", "`id` is `<conversation id>/turn<k>`"} {
		if !bytes.Contains(card, []byte(w)) {
			t.Errorf("card does not say %q:\n%s", w, card)
		}
	}
	// The check at the end of an export of a running job passes over
	// every turn row of a sample finished after the export began.
	fs.rows[0].FinishedAt = finished.Add(time.Hour)
	if rep, err := verify(context.Background(), fs, dir, "j", Options{EngineOf: o.EngineOf}, finished.Add(time.Minute)); err != nil || len(rep.Problems) > 0 {
		t.Errorf("verify passing over P1/m's turn rows: %v %v", rep.Problems, err)
	}
	fs.rows[0].FinishedAt = finished

	// With the history's reasoning kept, turn 2's history keeps it too.
	keep := t.TempDir()
	o.KeepHistoryReasoning = true
	if _, err := ExportWith(context.Background(), fs, keep, []string{FormatShareGPT}, "j", o); err != nil {
		t.Fatal(err)
	}
	for _, l := range readLines(t, filepath.Join(keep, DataDir, "j.sharegpt.jsonl")) {
		if r := l["conversations"].([]any)[1].(map[string]any)["reasoning_content"]; l["id"] == "P1/m/turn2" && r != "r0" {
			t.Errorf("P1/m/turn2 with the history's reasoning kept: turn 1's reasoning %v, want r0", r)
		}
	}
	if rep, err := Verify(context.Background(), fs, keep, "j", Options{EngineOf: o.EngineOf}); err != nil || len(rep.Problems) > 0 {
		t.Errorf("Verify of turn rows with the history's reasoning kept: %v %v", rep.Problems, err)
	}

	rep, err := Verify(context.Background(), fs, dir, "j", Options{EngineOf: o.EngineOf})
	if err != nil || len(rep.Problems) > 0 {
		t.Fatalf("Verify of the turn rows: %v %v", rep.Problems, err)
	}
	path := filepath.Join(dir, DataDir, "j.sharegpt.jsonl")
	b, _ = os.ReadFile(path)
	if err := os.WriteFile(path, bytes.Replace(b, []byte(`"turn":2`), []byte(`"turn":3`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err = Verify(context.Background(), fs, dir, "j", Options{EngineOf: o.EngineOf})
	if err != nil {
		t.Fatal(err)
	}
	var caught bool
	for _, p := range rep.Problems {
		caught = caught || p.Path == "data/j.sharegpt.jsonl" && p.Line == 2 && p.ID == "P1/m/turn2"
	}
	if !caught {
		t.Errorf("Verify after changing P1/m/turn2's turn: %v; want a problem at line 2", rep.Problems)
	}
}
