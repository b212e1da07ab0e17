package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// mixJob is the repro: a job started with one configuration, then
// re-run after the model, the temperature and max_tokens changed.
const mixJob = `name: mix
model: {{model}}
server:
  engine: sim
  sim: {profile: fast, speed: 4, output_mean: 300, output_sigma: 0.5, truncate_fraction: 0, seed: 5}
sources:
  - {partition: Q, path: q.jsonl, prompt: question, id: id}
lanes:
  - {name: default, concurrency: 16, max_tokens: {{max_tokens}}}
generation:
  temperature: {{temperature}}
output:
  formats: [sharegpt, openai-batch]
  metadata: full
quality: {truncated: false}
`

// editJob edits the job file at path: old, which must be there, becomes new
// (a faster simulator where the test's timing does not matter).
func editJob(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeMixJob(t *testing.T, dir, model, temperature, maxTokens string) {
	t.Helper()
	job := strings.NewReplacer("{{model}}", model, "{{temperature}}", temperature, "{{max_tokens}}", maxTokens).Replace(mixJob)
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestE2EConfigChange: a job interrupted with some of its 200 samples done
// under model sim-model, temperature 0.7, max_tokens 2000 is re-run with
// other-model, 1.3 and 500. The re-run is refused before anything is
// ingested or sent, exit 1, with the difference field by field. With
// --new-config every sample is generated again: the export holds 200
// records, each exactly once, every one from the new configuration, and
// the earlier answers are kept in the store's history.
func TestE2EConfigChange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeMixJob(t, dir, "sim-model", "0.7", "2000")
	want := writeChaosSource(t, filepath.Join(dir, "q.jsonl"), "Q", 200, rand.New(rand.NewPCG(7, 8)))

	p := startRegen(t, dir, "run", "--drain-timeout", "1s", "job.yaml")
	if !p.waitLine("ingest: ") {
		t.Fatalf("run ended before ingesting:\n%s", p.wait(t))
	}
	db := openStoreRO(t, filepath.Join(dir, "mix.db"))
	waitCounts(t, p, db, 19)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	if res := p.wait(t); res.code != 130 {
		t.Fatalf("interrupted first run: exit %d, want 130\n%s", res.code, res)
	}
	before, err := storeCounts(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	firstDone := before["done"]
	if firstDone < 19 || firstDone >= 200 {
		t.Fatalf("first run left %d done, want some of 200", firstDone)
	}
	var firstIDs []string
	rows, err := db.Query(`SELECT id FROM samples WHERE state = 'done' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		firstIDs = append(firstIDs, id)
	}
	rows.Close()

	// The changed job file is refused before any request.
	writeMixJob(t, dir, "other-model", "1.3", "500")
	refused := regen(t, dir, "run", "job.yaml")
	wantDiff := []string{
		"  generation.temperature: 0.7 -> 1.3",
		"  lanes.default.max_tokens: 2000 -> 500",
		"  model: sim-model -> other-model",
	}
	if refused.code != 1 || !strings.Contains(refused.stderr, strings.Join(wantDiff, "\n")) || !strings.Contains(refused.stderr, "--new-config") {
		t.Fatalf("re-run with a changed configuration: want exit 1 with the difference field by field\n%s", refused)
	}
	if strings.Contains(refused.stdout, "ingest:") {
		t.Errorf("refused run ingested:\n%s", refused)
	}
	after, err := storeCounts(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("refused run changed the store (-before +after):\n%s", diff)
	}
	t.Logf("first run: %d of 200 done; the changed job refused, exit %d:\n%s", firstDone, refused.code, refused.stderr)

	// --new-config accepts the change: everything is generated again, by a
	// faster simulator (its speed is no part of the configuration; the
	// re-run after this one checks that too).
	editJob(t, filepath.Join(dir, "job.yaml"), "speed: 4,", "speed: 40,")
	res := regen(t, dir, "run", "--new-config", "job.yaml")
	if res.code != 0 {
		t.Fatalf("run --new-config:\n%s", res)
	}
	if !strings.Contains(res.stdout, "configuration generation 2 started") {
		t.Errorf("run --new-config does not say it started generation 2:\n%s", res.stdout)
	}
	ex := checkExport(t, filepath.Join(dir, "out"), "mix", want, false)
	lines := readJSONL(t, filepath.Join(dir, "out", "data", "mix.sharegpt.jsonl"))
	regenerated := map[string]bool{}
	for _, id := range firstIDs {
		regenerated[id] = false
	}
	for _, raw := range lines {
		var rec struct {
			ID         string
			Provenance store.Provenance
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		p := rec.Provenance
		if p.Generation != 2 || p.Model != "other-model" || p.Engine != "sim" || p.EngineVersion == "" ||
			string(p.Sampling) != `"{\"max_tokens\":500,\"temperature\":1.3}"` { // JSON text, as in Parquet
			t.Errorf("%s: provenance %+v (sampling %s), want generation 2, other-model from the sim, temperature 1.3, max_tokens 500",
				rec.ID, p, p.Sampling)
		}
		if _, ok := regenerated[rec.ID]; ok {
			regenerated[rec.ID] = true
		}
	}
	for id, ok := range regenerated {
		if !ok {
			t.Errorf("%s, done in the first configuration, is not in the export", id)
		}
	}
	if len(ex.shareGPT) != len(want) {
		t.Errorf("export: %d records, want %d", len(ex.shareGPT), len(want))
	}
	var history, results int
	if err := db.QueryRow(`SELECT (SELECT count(*) FROM answer_history WHERE superseded_by = 2 AND generation = 1),
		(SELECT count(*) FROM results WHERE generation = 2)`).Scan(&history, &results); err != nil {
		t.Fatal(err)
	}
	if history != firstDone || results != len(want) {
		t.Errorf("store: %d answers of generation 1 in the history, %d results of generation 2; want %d and %d", history, results, firstDone, len(want))
	}

	rep, _ := status(t, dir, "job.yaml")
	if len(rep.Generations) != 2 || rep.Generations[0].Superseded != firstDone || rep.Generations[1].Answers != len(want) ||
		rep.Generations[1].ServedModel != "other-model" || rep.Generations[0].ServedModel != "sim-model" {
		t.Errorf("status generations = %+v, want 1 (%d superseded, sim-model) and 2 (%d answers, other-model)", rep.Generations, firstDone, len(want))
	}
	text := regen(t, dir, "status", "job.yaml")
	if !strings.Contains(text.stdout, "configuration: generation 2") || !strings.Contains(text.stdout, "generation 1 (fingerprint") {
		t.Errorf("status text does not show the generations:\n%s", text.stdout)
	}
	t.Logf("--new-config: %d answers of generation 1 superseded, %d regenerated; export %d records of generation 2 (%s)",
		history, firstDone, len(ex.shareGPT), res.dur.Round(1e6))

	// The same configuration again is no change: nothing is refused or redone.
	again := regen(t, dir, "run", "job.yaml")
	if again.code != 0 || strings.Contains(again.stdout, "generation 3") {
		t.Errorf("re-run with the same configuration:\n%s", again)
	}
}

// rebuildJob is a job whose ids are content hashes (no id mapping), so a
// changed system prompt gives every sample a new id.
const rebuildJob = `name: rebuild
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 8, output_mean: 120, truncate_fraction: 0, seed: 5}
sources:
  - {partition: Q, path: q.jsonl, prompt: question, system: %q}
lanes:
  - {name: default, concurrency: 16, max_tokens: 512}
output:
  formats: [sharegpt]
  metadata: full
quality: {truncated: false}
`

// TestE2ENewConfigRebuildKills: a finished job of 300 content-hash ids is
// run again with another system prompt under --new-config, SIGKILLed three
// times at random moments (during the rebuild of the stored requests or
// the generation), then run to the end. The export holds each of the 300
// prompts once, every record with the new system prompt and generation 2,
// and the store holds no sample of the old prompt.
func TestE2ENewConfigRebuildKills(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rng := chaosRNG(t, 29)
	writeChaosSource(t, filepath.Join(dir, "q.jsonl"), "Q", 300, rng)
	writeJob := func(system string) {
		if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(rebuildJob, system)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeJob("You are helpful.")
	if res := regen(t, dir, "run", "job.yaml"); res.code != 0 {
		t.Fatalf("first run:\n%s", res)
	}
	writeJob("You are terse.")
	for i := range 3 {
		p := startRegen(t, dir, "run", "--new-config", "job.yaml")
		time.Sleep(time.Duration(100+rng.IntN(1500)) * time.Millisecond)
		_ = p.cmd.Process.Kill()
		res := p.wait(t)
		t.Logf("kill %d: exit %d", i+1, res.code)
	}
	res := regen(t, dir, "run", "--new-config", "job.yaml")
	if res.code != 0 {
		t.Fatalf("run after the kills:\n%s", res)
	}
	lines := doneLines(t, filepath.Join(dir, "out"), "rebuild")
	seen := map[string]bool{}
	for _, raw := range lines {
		var rec struct {
			ID            string
			Conversations []struct{ Role, Content string }
			Provenance    store.Provenance
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		if seen[rec.ID] {
			t.Errorf("%s exported twice", rec.ID)
		}
		seen[rec.ID] = true
		if len(rec.Conversations) == 0 || rec.Conversations[0].Role != "system" || rec.Conversations[0].Content != "You are terse." ||
			rec.Provenance.Generation != 2 {
			t.Errorf("%s: first message %+v, generation %d; want the new system prompt, generation 2", rec.ID, rec.Conversations[:min(1, len(rec.Conversations))], rec.Provenance.Generation)
		}
	}
	if len(lines) != 300 {
		t.Errorf("export holds %d records, want 300", len(lines))
	}
	db := openStoreRO(t, filepath.Join(dir, "rebuild.db"))
	var samples, held int
	if err := db.QueryRow(`SELECT count(*), coalesce(sum(not_before < 0), 0) FROM samples`).Scan(&samples, &held); err != nil {
		t.Fatal(err)
	}
	if samples != 300 || held != 0 {
		t.Errorf("store holds %d samples (%d held back), want the 300 of the new prompt", samples, held)
	}
	t.Logf("after 3 kills: %d records; %s", len(lines), strings.TrimSpace(res.stdout[strings.Index(res.stdout, "ingest:"):][:200]))
}
