package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/export"
)

// TestE2ETrainingFilesOneRowSchema runs the demo (glaive rows with and
// without tools, multi-turn thinking rows, reasoning stripped from the
// history so some rows have no token ids) with full metadata and token
// ids, and reads every column of every ShareGPT file the manifest lists
// with DuckDB's JSON reader typing the columns from the first row only
// (sample_size=1): a key at any depth that the first row lacks fails the
// read, as it fails Hugging Face datasets' loader after its first block.
// The demo exported by regen before issue 33 fails it at line 6 (usage's
// "cached_tokens"). Parquet has a conversations column ending with the
// answer on every row.
func TestE2ETrainingFilesOneRowSchema(t *testing.T) {
	t.Parallel()
	query := duckDB(t)
	dir := t.TempDir()
	res := runDemo(t, dir, "speed: 40 ", "speed: 200 ",
		"  formats: [sharegpt, openai-batch, parquet]\n", "  formats: [sharegpt, openai-batch, parquet]\n  metadata: full\n  token_ids: true\n")
	out := filepath.Join(dir, "out")
	m := readManifest(t, out, "demo")
	read := map[string]int{}
	for _, f := range m.Files {
		if f.Format == export.FormatParquet || f.Format == export.FormatParquetNoTokenIDs {
			// Parquet in the JSONL's layout: a conversations column ending
			// with the answer, which both trainers need.
			r := query(fmt.Sprintf(`SELECT count(*)::INTEGER AS n FROM '%s' WHERE conversations[len(conversations)].role = 'assistant' AND json_valid(tools)`, filepath.Join(out, f.Path)))
			if n := r[0][0]["n"]; n != float64(f.Rows) || f.Rows == 0 {
				t.Errorf("%s: %v rows with a conversations column ending with the answer; manifest says %d", f.Path, n, f.Rows)
			}
			read[f.Format] = f.Rows
			continue
		}
		if f.Format != export.FormatShareGPT && f.Format != export.FormatShareGPTNoTokenIDs {
			continue
		}
		path := filepath.Join(out, f.Path)
		src := fmt.Sprintf(`read_json('%s', sample_size=1)`, path)
		r := query(
			// to_json(t) reads every column of every row: a bare count(*)
			// reads none and so types nothing.
			fmt.Sprintf(`SELECT count(*)::INTEGER AS n, count(*) FILTER (WHERE tools = '[]')::INTEGER AS no_tools, sum(length(to_json(t)))::BIGINT AS bytes FROM %s t`, src),
			fmt.Sprintf(`SELECT count(*)::INTEGER AS n FROM (SELECT unnest(conversations) AS m FROM %s) WHERE m.tool_calls IS NOT NULL`, src),
			// The demo's generation.chat_template_kwargs, on every row (issue 33 item 5).
			fmt.Sprintf(`SELECT count(*)::INTEGER AS n FROM %s WHERE chat_template_kwargs = '{"thinking":true}'`, src),
		)
		if kw := r[2][0]["n"]; kw != r[0][0]["n"] {
			t.Errorf("%s: %v of %v rows carry chat_template_kwargs {\"thinking\":true}", f.Path, kw, r[0][0]["n"])
		}
		n, noTools, calls := r[0][0]["n"], r[0][0]["no_tools"], r[1][0]["n"]
		t.Logf("%s: DuckDB (sample_size=1) reads %v rows (%v bytes as JSON), %v without tools, %v messages with tool calls", f.Path, n, r[0][0]["bytes"], noTools, calls)
		if n != float64(f.Rows) || f.Rows == 0 || r[0][0]["bytes"] == nil {
			t.Errorf("%s: DuckDB reads %v rows; manifest says %d", f.Path, n, f.Rows)
		}
		read[f.Format] = f.Rows
		if f.Format == export.FormatShareGPT && (noTools == float64(0) || noTools == n || calls == float64(0)) {
			t.Errorf("%s: %v of %v rows without tools, %v tool calls; want the demo's mix of rows with and without tools", f.Path, noTools, n, calls)
		}
	}
	if len(read) != 4 || read[export.FormatShareGPT] != read[export.FormatParquet] || read[export.FormatShareGPTNoTokenIDs] != read[export.FormatParquetNoTokenIDs] {
		t.Errorf("files read %v; want the ShareGPT and Parquet training files and their no-token-ids files, the same rows in each pair", read)
	}
	if want := fmt.Sprintf("%d without them, in demo.sharegpt.no-token-ids.jsonl and demo.no-token-ids.parquet", read[export.FormatShareGPTNoTokenIDs]); !strings.Contains(res.stdout, want) {
		t.Errorf("run does not say %q:\n%s", want, res.stdout)
	}
}
