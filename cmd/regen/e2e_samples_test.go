package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// samplesJob asks three answers per prompt of two partitions: A maps ids,
// B does not and repeats some prompts word for word.
const samplesJob = `name: k3
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 4, output_mean: 150, seed: 3}
sources:
  - {partition: A, path: a.jsonl, prompt: question, id: id, samples_per_prompt: 3}
  - {partition: B, path: b.jsonl, prompt: question, samples_per_prompt: 3}
lanes:
  - {name: default, concurrency: 32, max_tokens: 512}
output:
  formats: [sharegpt, openai-batch, parquet]
  metadata: full
quality: {truncated: false}
`

// TestE2ESamplesPerPromptKills runs a samples_per_prompt: 3 job, SIGKILLs
// the runner five times mid-dispatch, finishes it, and checks that every
// prompt has exactly three samples "<id>#0..2", each exported once, done in
// one attempt, with three distinct seeds and three distinct answers per
// prompt (the simulator answers a prompt the same way unless the seed
// differs, so distinct answers show the seeds reached the server).
func TestE2ESamplesPerPromptKills(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a 600-sample job with five kills; skipped with -short")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("kill seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(samplesJob), 0o644); err != nil {
		t.Fatal(err)
	}
	var rowsA, rowsB []string
	var prompts []string // the sample id prefix of every distinct prompt
	for i := range 150 {
		id := fmt.Sprintf("a-%03d", i)
		rowsA = append(rowsA, fmt.Sprintf(`{"id":%q,"question":"Question %d: %s"}`, id, i, strings.Repeat("why ", 1+i%40)))
		prompts = append(prompts, "A/"+id)
	}
	for i := range 60 {
		q := fmt.Sprintf("Other question %d", i%50) // rows 50..59 repeat rows 0..9
		rowsB = append(rowsB, fmt.Sprintf(`{"question":%q}`, q))
		if i < 50 {
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, q)
			h := sha256.Sum256([]byte("B\x00" + body))
			prompts = append(prompts, "B/"+hex.EncodeToString(h[:])[:32])
		}
	}
	for name, rows := range map[string][]string{"a.jsonl": rowsA, "b.jsonl": rowsB} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for _, p := range prompts {
		for j := range 3 {
			want = append(want, fmt.Sprintf("%s#%d", p, j))
		}
	}
	total := len(want)

	kills := 0
	for i := range 5 {
		p := startRegen(t, dir, "run", "job.yaml")
		p.waitLine("ingest: ")
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		res := p.wait(t)
		if !p.killed() {
			if res.code != 0 {
				t.Fatalf("run %d ended on its own with an error:\n%s", i+1, res)
			}
			t.Logf("run %d finished before its kill", i+1)
			continue
		}
		kills++
		if i == 0 {
			line := "ingest: 210 rows read: 600 new samples, 0 already stored, 0 bad rows (dead letters), 10 rows skipped because another row has their id (see regen stats); identical prompts without an id mapping became 3 samples of one prompt, not 3 per row"
			if !strings.Contains(res.stdout, line) {
				t.Errorf("first run's ingest line; want %q in:\n%s", line, res.stdout)
			}
		}
	}
	if kills < 3 {
		t.Fatalf("only %d of 5 kills hit a running runner; want >= 3", kills)
	}
	// The kills are done: the rest runs on a faster simulator (its speed
	// is no part of the configuration).
	editJob(t, filepath.Join(dir, "job.yaml"), "speed: 4,", "speed: 40,")
	final := regen(t, dir, "run", "job.yaml")
	if final.code != 0 {
		t.Fatalf("final run:\n%s", final)
	}
	if !strings.Contains(final.stdout, "ingest: 210 rows") || !strings.Contains(final.stdout, ": 0 new samples, 600 already stored,") {
		t.Errorf("final run's ingest line; want 0 new, 600 already stored:\n%s", final.stdout)
	}

	outDir := filepath.Join(dir, "out")
	ex := checkExport(t, outDir, "k3", want, true)
	if len(ex.shareGPT) != total {
		t.Errorf("sharegpt rows %d, want %d", len(ex.shareGPT), total)
	}
	type seeded struct {
		ID            string    `json:"id"`
		Seed          *int64    `json:"seed"`
		Conversations []genTurn `json:"conversations"`
	}
	seeds := map[string]map[int64]bool{}
	answers := map[string]map[string]bool{}
	for _, raw := range doneLines(t, outDir, "k3") {
		var r seeded
		if err := json.Unmarshal(raw, &r); err != nil || r.Seed == nil {
			t.Fatalf("sharegpt line without a seed (%v): %s", err, tail(raw, 200))
		}
		prompt := r.ID[:strings.LastIndex(r.ID, "#")]
		if seeds[prompt] == nil {
			seeds[prompt], answers[prompt] = map[int64]bool{}, map[string]bool{}
		}
		seeds[prompt][*r.Seed] = true
		if c := r.Conversations[len(r.Conversations)-1].Content; c != nil {
			answers[prompt][*c] = true
		}
	}
	if len(seeds) != len(prompts) {
		t.Errorf("%d prompts in the export, want %d", len(seeds), len(prompts))
	}
	for _, p := range prompts {
		if len(seeds[p]) != 3 || len(answers[p]) != 3 {
			t.Errorf("prompt %s: %d distinct seeds and %d distinct answers, want 3 of each", p, len(seeds[p]), len(answers[p]))
		}
	}
	rows, results := storeRows(t, filepath.Join(dir, "k3.db"))
	checkRowsOnce(t, rows, results, total)
	t.Logf("%d kills; %d prompts x 3 = %d samples, each exported once with its own seed", kills, len(prompts), total)
}
