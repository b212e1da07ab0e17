package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/export"
)

// turnRowLine is what the turn-rows test reads of a ShareGPT line.
type turnRowLine struct {
	ID             string  `json:"id"`
	ConversationID string  `json:"conversation_id"`
	Turn           int     `json:"turn"`
	InputIDs       []int32 `json:"input_ids"`
	LossMask       []int8  `json:"loss_mask"`
	TokenIDs       string  `json:"token_ids"`
	Usage          struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Turns []struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	} `json:"turns"`
}

func readTurnLines(t *testing.T, paths ...string) []turnRowLine {
	t.Helper()
	var out []turnRowLine
	for _, p := range paths {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			continue
		}
		for _, raw := range readJSONL(t, p) {
			var l turnRowLine
			if err := json.Unmarshal(raw, &l); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			out = append(out, l)
		}
	}
	return out
}

// turnRowsJob is a glaive-like multi-turn job (1 to 6 assistant turns per
// conversation) on the simulator with its drop-reasoning chat template,
// reasoning always on and generation.reasoning: strip_history: no later
// prompt starts with an earlier prompt and answer as generated, as with
// Kimi-K2.5.
const turnRowsJob = `name: mt
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 200, output_mean: 60, truncate_fraction: 0, seed: 11, chat_template: drop-reasoning, reasoning: always}
sources:
  - {partition: C, path: chats.jsonl, conversations: conversations, id: id}
lanes:
  - {name: default, concurrency: 48, max_tokens: 512}
generation: {reasoning: strip_history}
output: {formats: [sharegpt, parquet], metadata: full, token_ids: true, token_rows: turn}
quality: {truncated: false}
`

// runChatsJob writes jobYAML and n chats (chats.jsonl, drawn from seed)
// into a fresh folder, runs the job and verifies it; it returns the
// folder, each chat's turns and the run's result.
func runChatsJob(t *testing.T, jobYAML string, n int, seed uint64) (string, map[string]int, result) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(jobYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	want := writeChats(t, filepath.Join(dir, "chats.jsonl"), n, rand.New(rand.NewPCG(seed, 1)))
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 0 {
		t.Fatalf("run: %s", res)
	}
	if res := regen(t, dir, "verify", "job.yaml"); res.code != 0 {
		t.Fatalf("verify: %s", res)
	}
	return dir, want, res
}

// TestE2ETurnRows runs turnRowsJob with output.token_rows: turn: every
// done conversation's every turn is a row with ids, one mask as long as
// its ids, summing to that turn's completion tokens; Parquet holds the
// same rows and regen verify passes. The same store exported as
// conversation rows says, for each multi-turn conversation, that turn
// rows export it.
func TestE2ETurnRows(t *testing.T) {
	t.Parallel()
	dir, want, res := runChatsJob(t, turnRowsJob, 300, 31)
	job := filepath.Join(dir, "job.yaml")
	out := filepath.Join(dir, "out")
	train := readTurnLines(t, filepath.Join(out, "data", "mt.sharegpt.jsonl"))
	// A turn cut at max_tokens is in the truncated file beside data/.
	rows := append(slices.Clone(train), readTurnLines(t, filepath.Join(out, "mt.sharegpt.truncated.jsonl"))...)
	if noIDs := readTurnLines(t, filepath.Join(out, "mt.sharegpt.no-token-ids.jsonl")); len(noIDs) > 0 {
		t.Errorf("%d turn rows without ids, the first %s: %q", len(noIDs), noIDs[0].ID, noIDs[0].TokenIDs)
	}
	byConv := map[string][]turnRowLine{}
	for _, r := range rows {
		ones := 0
		for _, m := range r.LossMask {
			ones += int(m)
		}
		if len(r.InputIDs) == 0 || len(r.InputIDs) != len(r.LossMask) || ones != r.Usage.CompletionTokens {
			t.Errorf("%s: %d input_ids, %d loss_mask, mask sums to %d, the turn's completion tokens %d",
				r.ID, len(r.InputIDs), len(r.LossMask), ones, r.Usage.CompletionTokens)
		}
		if id := r.ConversationID + "/turn" + strconv.Itoa(r.Turn); r.ID != id {
			t.Errorf("row id %s, want %s", r.ID, id)
		}
		byConv[r.ConversationID] = append(byConv[r.ConversationID], r)
	}
	for _, got := range byConv {
		slices.SortFunc(got, func(a, b turnRowLine) int { return a.Turn - b.Turn })
	}
	for id, k := range want {
		if got := byConv[id]; len(got) != k {
			t.Errorf("%s: %d turns, %d turn rows", id, k, len(got))
		}
	}
	checkTurnParquet(t, filepath.Join(out, "data", "mt.parquet"), train)
	if said := fmt.Sprintf("token ids: %d of %d turn rows of %d done conversations with input_ids and loss_mask, 0 without them", len(rows), len(rows), len(want)); !strings.Contains(res.stdout, said) {
		t.Errorf("run does not say %q:\n%s", said, res.stdout)
	}

	// The same store, exported as conversation rows.
	b, _ := os.ReadFile(job)
	if err := os.WriteFile(job, []byte(strings.Replace(string(b), "token_rows: turn", "token_rows: conversation", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := regen(t, dir, "export", "job.yaml"); res.code != 0 {
		t.Fatalf("export (conversation rows): %s", res)
	}
	if res := regen(t, dir, "verify", "job.yaml"); res.code != 0 {
		t.Fatalf("verify (conversation rows): %s", res)
	}
	convs := readTurnLines(t, filepath.Join(out, "data", "mt.sharegpt.jsonl"), filepath.Join(out, "mt.sharegpt.no-token-ids.jsonl"), filepath.Join(out, "mt.sharegpt.truncated.jsonl"))
	var multi, said int
	for _, c := range convs {
		got := byConv[c.ID]
		for k, r := range got {
			if r.Turn != k+1 || (len(c.Turns) > 0 && r.Usage.CompletionTokens != c.Turns[k].Usage.CompletionTokens) {
				t.Errorf("%s: row %d is turn %d with %d completion tokens", c.ID, k, r.Turn, r.Usage.CompletionTokens)
			}
		}
		if len(c.Turns) > 1 {
			multi++
			if strings.Contains(c.TokenIDs, "output.token_rows: turn exports this conversation") {
				said++
			}
		}
	}
	t.Logf("%d conversations (%d multi-turn), %d turn rows, %d with ids; as conversation rows %d of the %d multi-turn say turn rows export them",
		len(convs), multi, len(rows), len(rows), said, multi)
	if len(convs) != len(want) || len(byConv) != len(want) || multi < 100 || said != multi {
		t.Errorf("%d conversations of %d, %d with turn rows, %d multi-turn, %d saying turn rows export them", len(convs), len(want), len(byConv), multi, said)
	}
}

// checkTurnParquet checks that the Parquet file holds the ShareGPT turn
// rows, in order, with the same ids and keys.
func checkTurnParquet(t *testing.T, path string, lines []turnRowLine) {
	t.Helper()
	rows, err := parquet.ReadFile[export.ParquetTurnRow](path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(lines) {
		t.Fatalf("parquet %d rows, sharegpt %d", len(rows), len(lines))
	}
	for i, r := range rows {
		l := lines[i]
		if r.ID != l.ID || r.ConversationID != l.ConversationID || int(r.Turn) != l.Turn || len(r.InputIDs) != len(l.InputIDs) || len(r.LossMask) != len(l.LossMask) {
			t.Errorf("parquet row %d: %s (%s turn %d, %d ids), sharegpt %s (%s turn %d, %d ids)",
				i, r.ID, r.ConversationID, r.Turn, len(r.InputIDs), l.ID, l.ConversationID, l.Turn, len(l.InputIDs))
			return
		}
	}
}

// TestE2ERenderCheck runs turnRowsJob on the simulator as vLLM, whose chat
// render route disagrees with its generation by one id for every second
// turn (render_skew on "question 1:", the second user message of each
// conversation): each of those turn rows is in the no-ids file, its reason
// naming the first differing index (the last id of that user message,
// 6 before the prompt's end: the 2-id end marker and the 3-id generation
// prompt follow it), and every other row keeps its ids.
func TestE2ERenderCheck(t *testing.T) {
	t.Parallel()
	job := strings.Replace(turnRowsJob, "sim: {", `sim: {engine: vllm, render_skew: "question 1:", `, 1)
	if job == turnRowsJob {
		t.Fatal("turnRowsJob has no sim block to make vLLM with a skewed render")
	}
	dir, want, _ := runChatsJob(t, job, 60, 37)
	out := filepath.Join(dir, "out")
	withIDs := readTurnLines(t, filepath.Join(out, "data", "mt.sharegpt.jsonl"), filepath.Join(out, "mt.sharegpt.truncated.jsonl"))
	noIDs := readTurnLines(t, filepath.Join(out, "mt.sharegpt.no-token-ids.jsonl"))
	second := 0
	for _, k := range want {
		if k >= 2 {
			second++
		}
	}
	for _, r := range withIDs {
		if r.Turn == 2 || len(r.InputIDs) == 0 {
			t.Errorf("%s: turn %d with %d ids in the training file", r.ID, r.Turn, len(r.InputIDs))
		}
	}
	for _, r := range noIDs {
		wantReason := fmt.Sprintf("unavailable: turn 2's prompt ids differ from the server's render of its messages (POST /v1/chat/completions/render) at index %d: ", r.Usage.PromptTokens-6)
		if r.Turn != 2 || !strings.HasPrefix(r.TokenIDs, wantReason) {
			t.Errorf("%s (turn %d, %d prompt tokens): token_ids %q, want %q...", r.ID, r.Turn, r.Usage.PromptTokens, r.TokenIDs, wantReason)
		}
	}
	total := 0
	for _, k := range want {
		total += k
	}
	t.Logf("%d conversations, %d turn rows: %d with ids, %d second turns without (render mismatch)", len(want), total, len(withIDs), len(noIDs))
	if len(noIDs) != second || len(withIDs)+len(noIDs) != total {
		t.Errorf("%d rows without ids, want the %d second turns; %d rows in all, want %d", len(noIDs), second, len(withIDs)+len(noIDs), total)
	}
}
