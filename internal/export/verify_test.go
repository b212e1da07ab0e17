package export

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// exportFixture exports the fixture in every format into a new folder.
func exportFixture(t *testing.T, st *fakeStore) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := Export(context.Background(), st, dir, Formats, "demo"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustVerify(t *testing.T, st Store, dir string) Report {
	t.Helper()
	r, err := Verify(context.Background(), st, dir, "demo", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// editFile rewrites one file of the export.
func editFile(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

// lines splits b after each newline (b ends with one).
func lines(b []byte) [][]byte {
	l := bytes.SplitAfter(b, []byte("\n"))
	return l[:len(l)-1]
}

// TestVerifyClean: a fresh export verifies: every listed file, row and
// store record, no problem.
func TestVerifyClean(t *testing.T) {
	st := fixture(t)
	dir := exportFixture(t, st)
	r := mustVerify(t, st, dir)
	if err := r.Err(); err != nil {
		t.Fatalf("clean export: %v", err)
	}
	// 7 files: the data files and the card (the manifest lists not itself).
	if r.Files != 7 || r.Rows != 14 || r.Records != 6 {
		t.Errorf("checked %d files, %d rows, %d records; want 7, 14, 6", r.Files, r.Rows, r.Records)
	}
}

// TestVerifyCatches damages one file of a clean export per case, the way a
// disk, a person or a script would, and wants the file, the line and the
// first mismatch named.
func TestVerifyCatches(t *testing.T) {
	sg := "demo.sharegpt.jsonl"
	tests := []struct {
		name string
		file string
		edit func([]byte) []byte
		want []string // each in one problem's text
	}{
		{"flip a bit", sg, func(b []byte) []byte {
			i := bytes.Index(b, []byte("hello"))
			b[i] ^= 0x01 // "hello" -> "iello"
			return b
		}, []string{
			"demo.sharegpt.jsonl: SHA-256 ",
			`demo.sharegpt.jsonl line 1 (P1/a1): differs from the store's current answer at byte`,
			`the file has 'ant","content":"iello"`,
		}},
		{"truncate", sg, func(b []byte) []byte { return b[:len(b)/2] }, []string{
			"bytes, the manifest says 938 (cut short or grown)",
			"demo.sharegpt.jsonl line 2 (P1/a2): cut short: the file ends 256 bytes into this line",
		}},
		{"delete a row", sg, func(b []byte) []byte {
			l := lines(b)
			return bytes.Join(append(l[:1:1], l[2:]...), nil)
		}, []string{
			"demo.sharegpt.jsonl: 2 rows, the manifest says 3",
			"demo.sharegpt.jsonl line 2 (P1/a3): the store's record here is P1/a2 (a line missing, added or moved)",
		}},
		{"add a row", sg, func(b []byte) []byte { return append(b, lines(b)[0]...) }, []string{
			"demo.sharegpt.jsonl: 4 rows, the manifest says 3",
			"demo.sharegpt.jsonl line 4 (P1/a1): the store has no finished record for this line",
		}},
		{"edit a record's text", sg, func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"content":"hello"`), []byte(`"content":"HELLO"`), 1)
		}, []string{
			"demo.sharegpt.jsonl line 1 (P1/a1): differs from the store's current answer at byte",
			`the file has 'ant","content":"HELLO"`,
		}},
		{"edit the rejected file", "demo.rejected.jsonl", func(b []byte) []byte {
			return bytes.Replace(b, []byte("think_tags"), []byte("think_tagz"), 1)
		}, []string{"demo.rejected.jsonl line 1 (P2/b1): differs"}},
		{"delete a file", "demo.openai-batch.jsonl", nil, []string{"demo.openai-batch.jsonl: listed in the manifest but missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := fixture(t)
			dir := exportFixture(t, st)
			path := filepath.Join(dir, tt.file)
			if tt.edit == nil {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			} else {
				editFile(t, path, tt.edit)
			}
			r := mustVerify(t, st, dir)
			err := r.Err()
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("Verify = %v, want ErrMismatch", err)
			}
			var all []string
			for _, p := range r.Problems {
				all = append(all, p.String())
			}
			text := strings.Join(all, "\n")
			t.Logf("%s:\n%s", tt.name, text)
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("problems do not say %q:\n%s", w, text)
				}
			}
			for _, p := range r.Problems {
				if p.Path != tt.file {
					t.Errorf("problem in %s, only %s was touched: %s", p.Path, tt.file, p)
				}
			}
		})
	}
}

// TestVerifyStoreMovedOn: the files are intact but the store's answer
// changed since (a regeneration): the record is named as stale.
func TestVerifyStoreMovedOn(t *testing.T) {
	st := fixture(t)
	dir := exportFixture(t, st)
	st.rows[0] = doneRow(t, "P1/a1", `{"messages":[{"role":"system","content":"be <brief> & kind"},{"role":"user","content":"hi"}]}`,
		llm.Result{Content: "a new answer", FinishReason: "stop", Model: "sim-model", Usage: llm.Usage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15}})
	r := mustVerify(t, st, dir)
	var got []string
	for _, p := range r.Problems {
		got = append(got, p.String())
	}
	text := strings.Join(got, "\n")
	for _, want := range []string{
		"demo.sharegpt.jsonl line 1 (P1/a1): differs from the store's current answer",
		"demo.openai-batch.jsonl line 1 (P1/a1): differs",
		"demo.parquet line 1 (P1/a1): column completion differs from the store's current answer",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("problems do not say %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "SHA-256") {
		t.Errorf("the files are intact, yet a checksum problem:\n%s", text)
	}
}

// TestVerifyParquetRowEdited: a Parquet file rewritten with one row missing
// (valid Parquet, so only the row check can tell) is named by row and id.
func TestVerifyParquetRowMissing(t *testing.T) {
	st := fixture(t)
	dir := exportFixture(t, st)
	short := &fakeStore{rows: []store.Row{st.rows[0], st.rows[2]}}
	other := t.TempDir()
	if _, err := Export(context.Background(), short, other, []string{FormatParquet}, "demo"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(other, "demo.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "demo.parquet"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := mustVerify(t, st, dir)
	text := ""
	for _, p := range r.Problems {
		text += p.String() + "\n"
	}
	for _, want := range []string{"demo.parquet: 2 rows, the manifest says 3", "demo.parquet line 2 (P1/a3): the store's record here is P1/a2"} {
		if !strings.Contains(text, want) {
			t.Errorf("problems do not say %q:\n%s", want, text)
		}
	}
}

// TestVerifyAfterExportSkipsNewer: the check at the end of an export of a
// running job passes over samples that finished after the export began,
// whether or not the files have them, and still checks the others.
func TestVerifyAfterExportSkipsNewer(t *testing.T) {
	st := fixture(t)
	dir := exportFixture(t, st)
	since := time.Now()
	later := doneRow(t, "P1/a15", `{"messages":[{"role":"user","content":"new"}]}`, llm.Result{Content: "new", FinishReason: "stop", Model: "sim-model"})
	later.FinishedAt = since.Add(time.Second)
	st.rows = append(st.rows[:1], append([]store.Row{later}, st.rows[1:]...)...)
	r, err := verify(context.Background(), st, dir, "demo", Options{}, since)
	if err != nil || r.Err() != nil {
		t.Fatalf("verify since the export = %v, %v; want no problem", err, r.Err())
	}
	// The strict check names the sample the files lack.
	if err := mustVerify(t, st, dir).Err(); err == nil || !strings.Contains(err.Error(), "P1/a15") {
		t.Errorf("strict Verify = %v, want P1/a15 named", err)
	}
}

// TestExportReportsDamagedPrevious: an export that replaces a file of the
// previous export which no longer matched its manifest says so.
func TestExportReportsDamagedPrevious(t *testing.T) {
	st := fixture(t)
	dir := exportFixture(t, st)
	editFile(t, filepath.Join(dir, "demo.dead.jsonl"), func(b []byte) []byte { return append(b, "x\n"...) })
	sum, err := Export(context.Background(), st, dir, Formats, "demo")
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Warnings) != 1 || !strings.HasPrefix(sum.Warnings[0], "the previous export's demo.dead.jsonl did not match its manifest (") {
		t.Errorf("warnings %q, want one naming demo.dead.jsonl", sum.Warnings)
	}
	if err := mustVerify(t, st, dir).Err(); err != nil {
		t.Errorf("after the export: %v", err)
	}
}

// TestVerifyUsesManifestSettings: records exported with full metadata and
// token ids verify although the caller's options say neither (the
// manifest's export block says how they were rendered); no manifest is an
// error, not a clean result.
func TestVerifyUsesManifestSettings(t *testing.T) {
	st := fixture(t)
	dir := t.TempDir()
	if _, err := ExportWith(context.Background(), st, dir, Formats, "demo", Options{Metadata: MetadataFull, TokenIDs: true}); err != nil {
		t.Fatal(err)
	}
	if err := mustVerify(t, st, dir).Err(); err != nil {
		t.Errorf("Verify with the caller's minimal options: %v", err)
	}
	if _, err := Verify(context.Background(), st, t.TempDir(), "demo", Options{}); err == nil || !strings.Contains(err.Error(), "demo.manifest.json") {
		t.Errorf("Verify without a manifest = %v, want an error naming it", err)
	}
}
