package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/export"
)

// TestE2ETrainerProfilesOneRowSchema runs the demo with token ids once
// and exports it four ways from the same store (output.trainer and
// token_rows change the export only): the default layout with
// conversation rows, speculators with turn rows, specforge with turn rows
// and ids, specforge without ids. DuckDB, a reader that is not regen's,
// reads every training file each manifest lists, JSONL with
// read_json(..., sample_size=1) (columns typed from the first row: a key
// a later row adds fails the read, as it fails datasets after its first
// block) and Parquet with read_parquet, every column of every row, and
// the counts match the manifest's.
func TestE2ETrainerProfilesOneRowSchema(t *testing.T) {
	t.Parallel()
	query := duckDB(t)
	dir := t.TempDir()
	const formats = "  formats: [sharegpt, openai-batch, parquet]\n"
	runDemo(t, dir, "speed: 40 ", "speed: 200 ", formats, "  formats: [sharegpt, parquet]\n  token_ids: true\n")
	exports := []struct {
		out, output string
		jsonKeys    []string // keys every ShareGPT row must have
	}{
		{"out", "", []string{"chat_template_kwargs", "partition"}},
		{"out-speculators", "  token_ids: true\n  token_rows: turn\n  trainer: speculators\n", []string{"chat_template_kwargs", "conversation_id", "turn"}},
		{"out-specforge", "  token_ids: true\n  trainer: specforge\n", []string{"source_id", "assistant_turn_index", "thinking", "input_ids"}},
		{"out-specforge-text", "  trainer: specforge\n", []string{"source_id", "assistant_turn_index", "thinking"}},
	}
	for _, e := range exports[1:] {
		job := filepath.Join(dir, "job.yaml")
		b, err := os.ReadFile(job)
		if err != nil {
			t.Fatal(err)
		}
		head, _, _ := strings.Cut(string(b), "  formats: [sharegpt, parquet]\n")
		if err := os.WriteFile(job, []byte(head+"  formats: [sharegpt, parquet]\n"+e.output), 0o644); err != nil {
			t.Fatal(err)
		}
		res := regen(t, dir, "export", "job.yaml", "--out", e.out)
		if res.code != 0 {
			t.Fatalf("export %s: %s", e.out, res)
		}
		if said := strings.Contains(res.stdout, "done conversations: train them with data.train_only_last_turn: true"); said != strings.Contains(e.out, "specforge") {
			t.Errorf("export %s says how to train SpecForge's rows: %v\n%s", e.out, said, res.stdout)
		}
	}
	for _, e := range exports {
		readTrainingFiles(t, query, filepath.Join(dir, e.out), e.jsonKeys)
	}
}

// readTrainingFiles reads every training file (and no-token-ids file) of
// the export in out with DuckDB and checks its row count against the
// manifest, that every ShareGPT row has keys, and the manifest's profile.
func readTrainingFiles(t *testing.T, query func(...string) [][]map[string]any, out string, keys []string) {
	t.Helper()
	m := readManifest(t, out, "demo")
	read := map[string]int{}
	for _, f := range m.Files {
		path := filepath.Join(out, f.Path)
		var src, where string
		switch f.Format {
		case export.FormatParquet, export.FormatParquetNoTokenIDs:
			src = fmt.Sprintf(`read_parquet('%s')`, path)
		case export.FormatShareGPT, export.FormatShareGPTNoTokenIDs:
			src = fmt.Sprintf(`read_json('%s', sample_size=1)`, path)
			for _, k := range keys {
				if f.Format == export.FormatShareGPTNoTokenIDs && k == "input_ids" {
					continue
				}
				where += fmt.Sprintf(` AND json_exists(to_json(t), '$.%s')`, k)
			}
		default:
			continue
		}
		// to_json(t) reads every column of every row: a bare count(*)
		// reads none and so types nothing.
		r := query(fmt.Sprintf(`SELECT count(*)::INTEGER AS n, count(*) FILTER (WHERE true%s)::INTEGER AS keyed, sum(length(to_json(t)))::BIGINT AS bytes FROM %s t`, where, src))
		n, keyed := r[0][0]["n"], r[0][0]["keyed"]
		t.Logf("%s (%s): DuckDB reads %v rows, %v bytes as JSON", filepath.Join(filepath.Base(out), f.Path), f.Format, n, r[0][0]["bytes"])
		if n != float64(f.Rows) || keyed != n || f.Rows > 0 && r[0][0]["bytes"] == nil {
			t.Errorf("%s: DuckDB reads %v rows, %v with %v; manifest says %d", f.Path, n, keyed, keys, f.Rows)
		}
		read[f.Format] += f.Rows
	}
	if read[export.FormatShareGPT] == 0 || read[export.FormatParquet] == 0 {
		t.Errorf("%s: rows read %v; want both training files", out, read)
	}
	want := ""
	if m.Export != nil {
		want = m.Export.Trainer
	}
	if base := filepath.Base(out); strings.Contains(base, "-") && !strings.Contains(base, want) || want == "" && base != "out" {
		t.Errorf("%s: manifest says trainer %q", out, want)
	}
}
