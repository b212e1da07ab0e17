package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/export"
)

// demoJob writes the demo job into dir with its data, edited by replace
// (old, new pairs applied in order).
func demoJob(t *testing.T, dir string, replace ...string) {
	t.Helper()
	copyExample(t, "demo/data", filepath.Join(dir, "data"))
	b, err := os.ReadFile("../../examples/demo/job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	job := string(b)
	for i := 0; i+1 < len(replace); i += 2 {
		if !strings.Contains(job, replace[i]) {
			t.Fatalf("demo job.yaml has no %q", replace[i])
		}
		job = strings.Replace(job, replace[i], replace[i+1], 1)
	}
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runDemo writes the demo job into dir as demoJob does and runs it to
// the end.
func runDemo(t *testing.T, dir string, replace ...string) result {
	t.Helper()
	demoJob(t, dir, replace...)
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 0 {
		t.Fatalf("run: %s", res)
	}
	return res
}

// TestE2ETokenIDs runs the multi-turn demo against the simulator with
// output.token_ids on and reasoning kept in the history (an append-only
// template sees every generated token again): every exported conversation
// has input_ids and loss_mask of one length, its mask adds up to the
// completion tokens of all its turns, the ids under the mask are the
// generated ones, and Parquet holds the same. With the history stripped
// of reasoning the multi-turn records say why they have none instead.
func TestE2ETokenIDs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	res := runDemo(t, dir, "speed: 40 ", "speed: 200 ",
		"    thinking: true\n", "    thinking: true\n  reasoning: keep\n",
		"  formats: [sharegpt, openai-batch, parquet]\n", "  formats: [sharegpt, parquet]\n  metadata: full\n  token_ids: true\n")
	if !strings.Contains(res.stdout, "token ids: ") {
		t.Errorf("run printed no token-id count:\n%s", res.stdout)
	}
	type usage struct {
		CompletionTokens int `json:"completion_tokens"`
	}
	var records, multi, tokens, stops int
	byID := map[string][]int32{}
	for _, raw := range readJSONL(t, filepath.Join(dir, "out", "data", "demo.sharegpt.jsonl")) {
		var r struct {
			ID       string  `json:"id"`
			InputIDs []int32 `json:"input_ids"`
			LossMask []int8  `json:"loss_mask"`
			TokenIDs string  `json:"token_ids"`
			Usage    usage   `json:"usage"`
			Turns    []struct {
				Usage usage `json:"usage"`
			} `json:"turns"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		records++
		if r.TokenIDs != "" || len(r.InputIDs) == 0 {
			t.Errorf("%s: no token ids: %q", r.ID, r.TokenIDs)
			continue
		}
		want := r.Usage.CompletionTokens
		if len(r.Turns) > 0 {
			multi++
			want = 0
			for _, tu := range r.Turns {
				want += tu.Usage.CompletionTokens
			}
		}
		ones := 0
		for _, m := range r.LossMask {
			ones += int(m)
		}
		if len(r.InputIDs) != len(r.LossMask) || ones != want {
			t.Errorf("%s: %d input_ids, %d loss_mask, mask sums to %d, completion tokens of its turns %d",
				r.ID, len(r.InputIDs), len(r.LossMask), ones, want)
		}
		// The simulator's generated words are ids 100 and up; its template
		// ids are below: the mask is on generated ids and, last in an
		// answer that stopped, the end token (2) the engine returns.
		for i, m := range r.LossMask {
			last := i+1 == len(r.LossMask) || r.LossMask[i+1] == 0
			if m == 1 && r.InputIDs[i] == 2 && last {
				stops++
				continue
			}
			if m == 1 && (r.InputIDs[i] < 100 || r.InputIDs[i] >= 1000) {
				t.Errorf("%s: mask 1 on template id %d at %d", r.ID, r.InputIDs[i], i)
				break
			}
		}
		tokens += len(r.InputIDs)
		byID[r.ID] = r.InputIDs
	}
	t.Logf("token ids: %d records (%d multi-turn), %d tokens, every mask equal to its turns' completion tokens, %d answers masked through their stop token", records, multi, tokens, stops)
	if records < 300 || multi < 20 || stops < records {
		t.Errorf("%d records, %d multi-turn: want the demo's hundreds, many multi-turn", records, multi)
	}
	rows, err := parquet.ReadFile[export.ParquetTokenRow](filepath.Join(dir, "out", "data", "demo.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if got, want := r.InputIDs, byID[r.ID]; len(got) != len(want) || len(r.LossMask) != len(got) || (len(got) > 0 && got[len(got)-1] != want[len(want)-1]) {
			t.Errorf("%s: parquet has %d ids and %d mask, sharegpt %d ids", r.ID, len(got), len(r.LossMask), len(want))
		}
	}
	if len(rows) != records {
		t.Errorf("parquet %d rows, sharegpt %d", len(rows), records)
	}

	// The demo as shipped (reasoning: strip_history): a later turn's prompt
	// lacks the earlier answers' reasoning, so a multi-turn record says so.
	strip := t.TempDir()
	res = runDemo(t, strip, "speed: 40 ", "speed: 200 ",
		"  formats: [sharegpt, openai-batch, parquet]\n", "  formats: [sharegpt]\n  metadata: full\n  token_ids: true\n")
	// The training file holds only rows with ids; the others are in the
	// no-token-ids file, each saying why, and the run counts them.
	var with, without int
	for _, file := range []string{"data/demo.sharegpt.jsonl", "demo.sharegpt.no-token-ids.jsonl"} {
		for _, raw := range readJSONL(t, filepath.Join(strip, "out", file)) {
			var r struct {
				ID       string  `json:"id"`
				InputIDs []int32 `json:"input_ids"`
				TokenIDs string  `json:"token_ids"`
				Turns    []any   `json:"turns"`
			}
			json.Unmarshal(raw, &r)
			switch {
			case file == "data/demo.sharegpt.jsonl" && r.TokenIDs == "" && len(r.InputIDs) > 0:
				with++
			case file != "data/demo.sharegpt.jsonl" && len(r.InputIDs) == 0 && len(r.Turns) > 0 && strings.Contains(r.TokenIDs, "re-renders"):
				without++
			default:
				t.Errorf("%s in %s: %d input_ids, token_ids %q", r.ID, file, len(r.InputIDs), r.TokenIDs)
			}
		}
	}
	t.Logf("strip_history: %d records with ids, %d multi-turn records unavailable (reasoning left out of the history)", with, without)
	if without == 0 {
		t.Error("strip_history: no multi-turn record says its ids do not line up")
	}
	if want := fmt.Sprintf("%d without them, in demo.sharegpt.no-token-ids.jsonl", without); !strings.Contains(res.stdout, want) {
		t.Errorf("run does not say %q:\n%s", want, res.stdout)
	}
}
