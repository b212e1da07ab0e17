package export

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// folderLoad is the set of files speculators' --data <folder> loads, by
// the rule in testdata/loader-rules.yaml (every file whose name ends in
// one of the suffixes, at any depth when recursive).
func folderLoad(t *testing.T, folder string) []string {
	t.Helper()
	rule := loadLoaderRules(t).Speculators
	var got []string
	err := filepath.WalkDir(folder, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && path != folder && !rule.Recursive {
			return filepath.SkipDir
		}
		if !e.IsDir() && slices.ContainsFunc(rule.FolderSuffixes, func(s string) bool { return strings.HasSuffix(e.Name(), s) }) {
			rel, _ := filepath.Rel(folder, path)
			got = append(got, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestTrainerFolderSeesOnlyTrainingRows: an export with every format, token
// ids (one row without), rejects, dead letters and batch errors; a trainer
// pointed at the data folder loads exactly the training file, whose rows
// are the done samples with ids, and none of the side files.
func TestTrainerFolderSeesOnlyTrainingRows(t *testing.T) {
	dir := t.TempDir()
	sum, err := ExportWith(context.Background(), tokenFixture(t), dir, Formats, "j", Options{TokenIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	got := folderLoad(t, filepath.Join(dir, DataDir))
	if !slices.Equal(got, []string{"j.sharegpt.jsonl"}) {
		t.Fatalf("a folder load of %s/ picks %v, want only j.sharegpt.jsonl", DataDir, got)
	}
	rows := readLines(t, filepath.Join(dir, DataDir, "j.sharegpt.jsonl"))
	if len(rows) != sum.TokenIDs || len(rows) == 0 {
		t.Errorf("the folder load reads %d rows, want the %d done samples with token ids", len(rows), sum.TokenIDs)
	}
	for _, r := range rows {
		if _, ok := r["conversations"]; !ok || r["input_ids"] == nil {
			t.Errorf("row %v is not a training row with ids", r["id"])
		}
	}
	// Every side file regen wrote is outside the data folder.
	for _, f := range sum.Files {
		inData := filepath.Dir(f.Path) == filepath.Join(dir, DataDir)
		training := f.Format == FormatShareGPT || f.Format == FormatParquet
		if inData != training {
			t.Errorf("%s (%s): in %s/ = %v, want %v", f.Path, f.Format, DataDir, inData, training)
		}
	}
	if sum.Rejected+sum.Dead+sum.TokenIDsUnavailable == 0 {
		t.Fatalf("fixture has no side rows: %+v", sum)
	}
}

// TestExportMovesEarlierLayout: training files an export from before the
// data folder left in the export folder make verify say stale; the next
// export removes them, and verify is clean again.
func TestExportMovesEarlierLayout(t *testing.T) {
	dir := t.TempDir()
	st := fixture(t)
	if _, err := Export(context.Background(), st, dir, []string{FormatShareGPT}, "demo"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, DataDir, "demo.sharegpt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"demo.sharegpt.jsonl", "demo.parquet"} {
		if err := os.WriteFile(filepath.Join(dir, old), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := Verify(context.Background(), st, dir, "demo", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"demo.sharegpt.jsonl", "demo.parquet"} {
		if !slices.ContainsFunc(rep.Problems, func(p Problem) bool { return p.Path == old && strings.Contains(p.What, "stale") }) {
			t.Errorf("verify does not call the earlier layout's %s stale: %v", old, rep.Problems)
		}
	}
	sum, err := Export(context.Background(), st, dir, []string{FormatShareGPT}, "demo")
	if err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"demo.sharegpt.jsonl", "demo.parquet"} {
		if _, err := os.Stat(filepath.Join(dir, old)); !os.IsNotExist(err) {
			t.Errorf("the earlier layout's %s is still there (stat: %v)", old, err)
		}
	}
	// The earlier Parquet file asked for its format again (earlierFormats).
	if !slices.Contains(sum.Refreshed, FormatParquet) {
		t.Errorf("refreshed %v, want parquet (an earlier export wrote it)", sum.Refreshed)
	}
	if rep, err := Verify(context.Background(), st, dir, "demo", Options{}); err != nil || len(rep.Problems) > 0 {
		t.Errorf("verify after the move: %v %v", err, rep.Problems)
	}
}

// tokenFixture is fixture (rejects, dead letters, a bad row, answers
// without ids) plus two answers with token ids.
func tokenFixture(t *testing.T) *fakeStore {
	fs := fixture(t)
	fs.rows = append(fs.rows,
		doneRow(t, "P1/t1", `{"messages":[{"role":"user","content":"d"}]}`, answer(ids(5, 6), ids(7))),
		doneRow(t, "P1/t2", `{"messages":[{"role":"user","content":"e"}]}`, answer(ids(5, 8), ids(9, 10))))
	return fs
}

// TestExportTruncatedApart: an answer cut at max_tokens (P1/a3 in the
// fixture) goes to the truncated files, not the training files, unless
// Options.TrainTruncated; switching the option removes the files it no
// longer writes, and each export verifies.
func TestExportTruncatedApart(t *testing.T) {
	dir := t.TempDir()
	st := fixture(t)
	ids := func(path string) []string {
		var out []string
		for _, m := range readLines(t, path) {
			out = append(out, m["id"].(string))
		}
		return out
	}
	train := filepath.Join(dir, DataDir, "demo.sharegpt.jsonl")
	trunc := filepath.Join(dir, "demo.sharegpt.truncated.jsonl")
	sum, err := Export(context.Background(), st, dir, []string{FormatShareGPT, FormatParquet}, "demo")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(train); slices.Contains(got, "P1/a3") || len(got) != 2 {
		t.Errorf("training file ids %v, want the 2 untruncated", got)
	}
	if got := ids(trunc); !slices.Equal(got, []string{"P1/a3"}) || sum.Truncated != 1 {
		t.Errorf("truncated file ids %v (summary %d), want [P1/a3]", got, sum.Truncated)
	}
	if _, err := ExportWith(context.Background(), st, dir, []string{FormatShareGPT, FormatParquet}, "demo", Options{TrainTruncated: true}); err != nil {
		t.Fatal(err)
	}
	if got := ids(train); !slices.Contains(got, "P1/a3") || len(got) != 3 {
		t.Errorf("with TrainTruncated the training file ids %v, want all 3", got)
	}
	for _, f := range []string{trunc, filepath.Join(dir, "demo.truncated.parquet")} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left behind with TrainTruncated (stat: %v)", filepath.Base(f), err)
		}
	}
}

// datasetsFolderLoad is the set of files load_dataset("<folder>") reads
// from a folder without a card, by the rule in testdata/loader-rules.yaml:
// one builder from the most common dot-suffix of the file names (ties by
// folder_draw_order), then only the files of that builder's extension.
func datasetsFolderLoad(t *testing.T, folder string) []string {
	t.Helper()
	rules := loadLoaderRules(t).Datasets
	if rules.FolderSource == "" || len(rules.FolderDrawOrder) == 0 {
		t.Fatalf("loader-rules.yaml has no folder rule: %+v", rules)
	}
	var files []string
	count := map[string]int{}
	err := filepath.WalkDir(folder, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(folder, path)
		files = append(files, filepath.ToSlash(rel))
		for _, suffix := range strings.Split(e.Name(), ".")[1:] {
			count["."+strings.ToLower(suffix)]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rank := func(ext string) int { // higher wins a draw
		if i := slices.Index(rules.FolderDrawOrder, ext); i >= 0 {
			return len(rules.FolderDrawOrder) - i
		}
		return 0
	}
	best := ""
	for ext, n := range count {
		if rules.BuilderByExtension[ext] == "" {
			continue
		}
		if best == "" || n > count[best] || n == count[best] && rank(ext) > rank(best) {
			best = ext
		}
	}
	var got []string
	for _, f := range files {
		if rules.BuilderByExtension[filepath.Ext(f)] == rules.BuilderByExtension[best] {
			got = append(got, f)
		}
	}
	return got
}

// TestDatasetsFolderLoadReadsOneCopy: data/ holds the ShareGPT JSONL and
// the Parquet file, the same rows twice; load_dataset on the folder (no
// card in it) reads one of them, the Parquet file, and speculators'
// --data on it the JSONL alone; with one format only, that one.
func TestDatasetsFolderLoadReadsOneCopy(t *testing.T) {
	for _, tt := range []struct {
		formats           []string
		datasets, specula []string
	}{
		{Formats, []string{"j.parquet"}, []string{"j.sharegpt.jsonl"}},
		{[]string{FormatShareGPT}, []string{"j.sharegpt.jsonl"}, []string{"j.sharegpt.jsonl"}},
		{[]string{FormatParquet}, []string{"j.parquet"}, nil},
	} {
		dir := t.TempDir()
		if _, err := ExportWith(context.Background(), tokenFixture(t), dir, tt.formats, "j", Options{TokenIDs: true, Profile: Profile{Trainer: TrainerSpeculators}}); err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(dir, DataDir)
		if got := datasetsFolderLoad(t, data); !slices.Equal(got, tt.datasets) {
			t.Errorf("%v: load_dataset(%q) reads %v, want %v", tt.formats, DataDir, got, tt.datasets)
		}
		if got := folderLoad(t, data); !slices.Equal(got, tt.specula) {
			t.Errorf("%v: speculators --data %s reads %v, want %v", tt.formats, DataDir, got, tt.specula)
		}
	}
}
