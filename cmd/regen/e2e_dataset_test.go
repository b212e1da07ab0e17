package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
	"github.com/google/go-cmp/cmp"
)

const datasetJob = `name: ds
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 50, output_mean: 60, seed: 5}
sources:
  - {partition: A, path: a.jsonl, prompt: question, id: id, system: "Be brief.", samples_per_prompt: 2}
  - {partition: B, path: b.jsonl, messages: messages, id: id}
lanes:
  - {name: default, concurrency: 16, max_tokens: 256}
output:
  formats: [sharegpt, openai-batch, parquet]
quality: {truncated: false}
`

// TestE2EDatasetReadByDuckDB exports a job and reads it as a Hugging Face
// user would, with a reader that is not regen's: the card's front matter
// names the data files, DuckDB (from npm) reads each without options, and
// its row counts, Parquet columns and nested messages match; every file's
// SHA-256, size and rows match the manifest.
func TestE2EDatasetReadByDuckDB(t *testing.T) {
	t.Parallel()
	query := duckDB(t)
	dir := t.TempDir()
	var a, b []string
	for i := range 30 {
		a = append(a, fmt.Sprintf(`{"id":"a-%02d","question":"Question %d?"}`, i, i))
	}
	for i := range 10 {
		b = append(b, fmt.Sprintf(`{"id":"b-%02d","messages":[{"role":"user","content":"Hi %d"},{"role":"assistant","content":"old"},{"role":"user","content":"And then %d?"}]}`, i, i, i))
	}
	for name, rows := range map[string][]string{"a.jsonl": a, "b.jsonl": b, "job.yaml": {datasetJob}} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if res := regen(t, dir, "run", "job.yaml"); res.code != 0 {
		t.Fatalf("run:\n%s", res)
	}
	out := filepath.Join(dir, "out")

	m := readManifest(t, out, "ds")
	rows := map[string]int{}
	for _, f := range m.Files {
		data, err := os.ReadFile(filepath.Join(out, f.Path))
		if err != nil {
			t.Fatalf("manifest names %s: %v", f.Path, err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != f.SHA256 || int64(len(data)) != f.Bytes {
			t.Errorf("%s: sha256 %s and %d bytes on disk; manifest: %s, %d", f.Path, got, len(data), f.SHA256, f.Bytes)
		}
		if strings.HasSuffix(f.Path, ".jsonl") && bytes.Count(data, []byte("\n")) != f.Rows {
			t.Errorf("%s: %d lines; manifest: %d rows", f.Path, bytes.Count(data, []byte("\n")), f.Rows)
		}
		rows[f.Path] = f.Rows
	}
	// Done answers cut at max_tokens are in the truncated file, not the
	// training file (output.train_truncated off).
	if m.Totals.Done+m.Totals.Rejected != 70 || rows["data/ds.parquet"]+rows["ds.truncated.parquet"] != m.Totals.Done ||
		rows["ds.truncated.parquet"] != m.Totals.Truncated || m.Totals.Done == 0 {
		t.Errorf("manifest totals %+v, parquet rows %d + %d truncated; want 70 samples (30 x 2 + 10), the done ones in parquet, the truncated apart", m.Totals, rows["data/ds.parquet"], rows["ds.truncated.parquet"])
	}
	if len(m.Servers) != 1 || m.Servers[0].Answers < m.Totals.Done || !slices.Contains(m.Servers[0].Models, "sim-model") {
		t.Errorf("manifest servers %+v; want the one sim endpoint with sim-model answers", m.Servers)
	}
	if m.Tokens.Completion.N == 0 || m.Tokens.Completion.P50 == 0 || m.Tokens.Prompt.Max < m.Tokens.Prompt.P50 {
		t.Errorf("manifest tokens %+v", m.Tokens)
	}

	// The card: front matter whose configs name the files to load.
	card, err := os.ReadFile(filepath.Join(out, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.SplitN(string(card), "---\n", 3)
	if len(parts) != 3 || parts[0] != "" {
		t.Fatalf("README.md does not start with YAML front matter:\n%s", card)
	}
	var front struct {
		Configs []struct {
			Name      string `yaml:"config_name"`
			Default   bool   `yaml:"default"`
			DataFiles []struct {
				Split string `yaml:"split"`
				Path  string `yaml:"path"`
			} `yaml:"data_files"`
		} `yaml:"configs"`
		Size []string `yaml:"size_categories"`
	}
	if err := yaml.Unmarshal([]byte(parts[1]), &front); err != nil {
		t.Fatalf("card front matter: %v\n%s", err, parts[1])
	}
	if diff := cmp.Diff([]string{"n<1K"}, front.Size); diff != "" {
		t.Errorf("size_categories (-want +got):\n%s", diff)
	}
	files := map[string]string{}
	for _, c := range front.Configs {
		for _, f := range c.DataFiles {
			files[c.Name] = f.Path
			if f.Split != "train" {
				t.Errorf("config %s: split %q, want train", c.Name, f.Split)
			}
		}
		if !c.Default {
			t.Errorf("config %s: not the default; want the card's one config the default", c.Name)
		}
	}
	// One config: datasets reads every config of a card with the builder
	// of the first one's files, so the card names the JSONL only.
	if diff := cmp.Diff(map[string]string{"sharegpt": "data/ds.sharegpt.jsonl"}, files); diff != "" {
		t.Fatalf("card data files (-want +got):\n%s", diff)
	}
	files["parquet"] = "data/ds.parquet"

	pq := filepath.Join(out, files["parquet"])
	jl := filepath.Join(out, files["sharegpt"])
	res := query(
		fmt.Sprintf(`SELECT count(*)::INTEGER AS n FROM '%s'`, pq),
		fmt.Sprintf(`SELECT count(*)::INTEGER AS n FROM '%s'`, jl),
		fmt.Sprintf(`SELECT column_name FROM (DESCRIBE SELECT * FROM '%s')`, pq),
		fmt.Sprintf(`SELECT id, len(conversations)::INTEGER AS n, conversations[1].role AS r1, conversations[1].content AS c1, conversations[2].role AS r2, conversations[2].content AS c2, conversations[3].role AS r3
			FROM '%s' WHERE id IN ('A/a-07#1', 'B/b-03') ORDER BY id`, pq),
		fmt.Sprintf(`SELECT conversations[2].content AS c FROM '%s' WHERE id = 'A/a-07#1'`, jl),
	)
	if n := res[0][0]["n"]; n != float64(rows["data/ds.parquet"]) {
		t.Errorf("DuckDB counts %v rows in %s; manifest says %d", n, files["parquet"], rows["data/ds.parquet"])
	}
	if n := res[1][0]["n"]; n != float64(rows["data/ds.sharegpt.jsonl"]) {
		t.Errorf("DuckDB counts %v rows in %s; manifest says %d", n, files["sharegpt"], rows["data/ds.sharegpt.jsonl"])
	}
	var cols []string
	for _, r := range res[2] {
		cols = append(cols, r["column_name"].(string))
	}
	wantCols := []string{"id", "source_id", "conversations", "tools", "partition", "truncated", "chat_template_kwargs", "lane",
		"finish_reason", "prompt_tokens", "completion_tokens", "endpoint", "seed",
		"generation", "model", "engine", "engine_version", "system_fingerprint", "sampling"}
	if diff := cmp.Diff(wantCols, cols); diff != "" {
		t.Errorf("Parquet columns as DuckDB reads them (-want +got):\n%s", diff)
	}
	wantMsgs := []map[string]any{
		{"id": "A/a-07#1", "n": float64(3), "r1": "system", "c1": "Be brief.", "r2": "user", "c2": "Question 7?", "r3": "assistant"},
		{"id": "B/b-03", "n": float64(4), "r1": "user", "c1": "Hi 3", "r2": "assistant", "r3": "user"},
	}
	if len(res[3]) == 2 {
		if c, _ := res[3][1]["c2"].(string); c == "" || c == "old" {
			t.Errorf("B/b-03's history holds %q; want the regenerated answer, not the dataset's", c)
		}
		delete(res[3][1], "c2") // the regenerated text, checked above
	}
	if diff := cmp.Diff(wantMsgs, res[3]); diff != "" {
		t.Errorf("nested messages as DuckDB reads them (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]map[string]any{{"c": "Question 7?"}}, res[4]); diff != "" {
		t.Errorf("sharegpt conversations as DuckDB reads them (-want +got):\n%s", diff)
	}

	// A README.md the user wrote survives the next export, which says so.
	mine := []byte("# ds\n\nMy own card.\n")
	if err := os.WriteFile(filepath.Join(out, "README.md"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	ex := regen(t, dir, "export", "job.yaml")
	if got, _ := os.ReadFile(filepath.Join(out, "README.md")); ex.code != 0 || !bytes.Equal(got, mine) ||
		!strings.Contains(ex.stdout, "warning: ") || !strings.Contains(ex.stdout, "README.md was not written by regen") {
		t.Errorf("export over a user's README.md: exit %d, README now %q; want it kept and a warning:\n%s", ex.code, got, ex)
	}
}
