package export

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

var errFake = errors.New("disk on fire")

// fakeStore implements the two Store methods export reads (Finished and
// EachIngestError); any other call
// panics on the nil embedded interface.
type fakeStore struct {
	store.Store
	rows      []store.Row
	bad       []store.IngestError
	failAfter int  // Finished fails after this many rows; 0 = never
	failBad   bool // EachIngestError fails after the first bad row
	gens      []store.Generation
}

func (f *fakeStore) Generations(context.Context) ([]store.Generation, error) { return f.gens, nil }

func (f *fakeStore) Finished(ctx context.Context, fn func(store.Row) error) error {
	for i, r := range f.rows {
		if f.failAfter > 0 && i == f.failAfter {
			return errFake
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeStore) EachIngestError(ctx context.Context, fn func(store.IngestError) error) error {
	for _, e := range f.bad {
		if err := fn(e); err != nil {
			return err
		}
		if f.failBad {
			return errFake
		}
	}
	return nil
}

// Counts, RejectCounts and EachTokenCount are computed from rows, as a
// store's counters would be, for the manifest.
func (f *fakeStore) Counts(ctx context.Context) ([]store.Count, error) {
	n := map[store.Count]int{}
	for _, r := range f.rows {
		n[store.Count{Partition: r.Partition, Lane: r.Lane, State: r.State}]++
	}
	var out []store.Count
	for c, k := range n {
		c.N = k
		out = append(out, c)
	}
	return out, nil
}

func (f *fakeStore) RejectCounts(ctx context.Context) ([]store.RejectCount, error) {
	n := map[store.RejectCount]int{}
	for _, r := range f.rows {
		if r.State == store.Rejected {
			n[store.RejectCount{Partition: r.Partition, Lane: r.Lane, Rule: r.Rule}]++
		}
	}
	var out []store.RejectCount
	for c, k := range n {
		c.N = k
		out = append(out, c)
	}
	return out, nil
}

func (f *fakeStore) EachTokenCount(ctx context.Context, fn func(store.TokenCount) error) error {
	n := map[store.TokenCount]int{}
	for _, r := range f.rows {
		if r.State == store.Dead {
			continue
		}
		for _, a := range append(slices.Clone(r.Prior), r.Result) {
			n[store.TokenCount{Partition: r.Partition, Lane: r.Lane, Kind: store.PromptKind, Tokens: a.PromptTokens}]++
			n[store.TokenCount{Partition: r.Partition, Lane: r.Lane, Kind: store.CompletionKind, Tokens: a.CompletionTokens}]++
		}
	}
	for c, k := range n {
		c.N = k
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

var finished = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func result(t testing.TB, r llm.Result) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func doneRow(t testing.TB, id, body string, res llm.Result) store.Row {
	return store.Row{
		ID: id, Partition: "P1", Lane: "short", State: store.Done, Body: []byte(body), Attempts: 1,
		Result: store.Result{
			Response: result(t, res), FinishReason: res.FinishReason,
			PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens,
			Endpoint: "http://127.0.0.1:30000",
		},
		FinishedAt: finished,
	}
}

// fixture covers every row shape export handles, in id order. Ids are
// "<partition>/<source row id>", as ingest makes them.
func fixture(t testing.TB) *fakeStore {
	call := llm.ToolCall{ID: "call_1", Type: "function"}
	call.Function.Name = "get_weather"
	call.Function.Arguments = `{"city":"Paris"}`
	return &fakeStore{
		rows: []store.Row{
			doneRow(t, "P1/a1", `{"messages":[{"role":"system","content":"be <brief> & kind"},{"role":"user","content":"hi"}]}`,
				llm.Result{Content: "hello", ReasoningContent: "think", FinishReason: "stop", Model: "sim-model",
					Usage: llm.Usage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15}}),
			doneRow(t, "P1/a2", `{"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather"}}]}`,
				llm.Result{ToolCalls: []llm.ToolCall{call}, FinishReason: "tool_calls", Model: "sim-model",
					Usage: llm.Usage{PromptTokens: 20, CompletionTokens: 9, TotalTokens: 29}}),
			doneRow(t, "P1/a3", `{"messages":[{"role":"user","content":[{"type":"text","text":"part"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42","tool_call_id":"c","name":"f"},{"role":"user","content":"go on"}],"tools":null}`,
				llm.Result{Content: "long answer cut", FinishReason: "length", Model: "sim-model",
					Usage: llm.Usage{PromptTokens: 40, CompletionTokens: 100, TotalTokens: 140}}),
			{ID: "P2/b1", Partition: "P2", Lane: "long", State: store.Rejected, Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`),
				Attempts: 1, Result: store.Result{Response: []byte(`{"content":"<think>bad"}`), FinishReason: "stop"}, Rule: "think_tags",
				Reason: "content holds <think> at byte 0", FinishedAt: finished},
			{ID: "P2/c1", Partition: "P2", Lane: "long", State: store.Dead, Body: []byte(`{"messages":[]}`),
				Attempts: 1, Reason: "bad-request (HTTP 400): context too long", FinishedAt: finished},
		},
		bad: []store.IngestError{{Partition: "P2", Origin: "data/x.jsonl:7", Field: "input", Reason: "field input: missing"}},
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", name, diff)
	}
}

// readLines parses every line of a JSONL file; a torn line fails the test.
func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for n := 1; sc.Scan(); n++ {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s:%d: torn or invalid line: %v", path, n, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestExportGolden(t *testing.T) {
	dir := t.TempDir()
	sum, err := Export(context.Background(), fixture(t), dir, Formats, "demo")
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	wantSum := Summary{
		Files: []File{
			{Format: "sharegpt", Path: filepath.Join(dir, "demo.sharegpt.jsonl"), Rows: 3},
			{Format: "openai-batch", Path: filepath.Join(dir, "demo.openai-batch.jsonl"), Rows: 3},
			{Format: "openai-batch-errors", Path: filepath.Join(dir, "demo.errors.jsonl"), Rows: 2},
			{Format: "parquet", Path: filepath.Join(dir, "demo.parquet"), Rows: 3},
			{Format: "rejected", Path: filepath.Join(dir, "demo.rejected.jsonl"), Rows: 1},
			{Format: "dead", Path: filepath.Join(dir, "demo.dead.jsonl"), Rows: 2},
			{Format: "card", Path: filepath.Join(dir, "README.md")},
			{Format: "manifest", Path: filepath.Join(dir, "demo.manifest.json")},
		},
		Done: 3, Truncated: 1, Rejected: 1, RejectedBy: map[string]int{"think_tags": 1}, Dead: 1, BadRows: 1,
		DoneByGeneration: map[int]int{0: 3}, // the fixture's answers name no generation
		// Read back after the export: 7 listed files (the manifest itself
		// not), their 14 lines and rows, 6 store records (one a bad row).
		Verified: Report{Manifest: filepath.Join(dir, "demo.manifest.json"), Files: 7, Rows: 14, Records: 6},
	}
	if diff := cmp.Diff(wantSum, sum); diff != "" {
		t.Errorf("Summary mismatch (-want +got):\n%s", diff)
	}
	for _, name := range []string{"demo.sharegpt.jsonl", "demo.openai-batch.jsonl", "demo.errors.jsonl", "demo.rejected.jsonl", "demo.dead.jsonl"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		readLines(t, filepath.Join(dir, name))
		golden(t, strings.TrimPrefix(name, "demo.")+".golden", b)
	}

	rows, err := parquet.ReadFile[ParquetRow](filepath.Join(dir, "demo.parquet"))
	if err != nil {
		t.Fatalf("read parquet: %v", err)
	}
	s := func(v string) *string { return &v }
	want := []ParquetRow{
		{ID: "P1/a1", SourceID: "a1", Partition: "P1", Lane: "short", Messages: []ParquetMessage{{Role: "system", Content: s("be <brief> & kind")}, {Role: "user", Content: s("hi")}},
			Completion: "hello", ReasoningContent: s("think"), FinishReason: "stop", PromptTokens: 12, CompletionTokens: 3},
		{ID: "P1/a2", SourceID: "a2", Partition: "P1", Lane: "short", Messages: []ParquetMessage{{Role: "user", Content: s("weather?")}},
			Tools:        s(`[{"type":"function","function":{"name":"get_weather"}}]`),
			ToolCalls:    s(`[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`),
			FinishReason: "tool_calls", PromptTokens: 20, CompletionTokens: 9},
		{ID: "P1/a3", SourceID: "a3", Partition: "P1", Lane: "short", Messages: []ParquetMessage{
			{Role: "user", Content: s(`[{"type":"text","text":"part"}]`)},
			{Role: "assistant", ToolCalls: s(`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`)},
			{Role: "tool", Content: s("42"), ToolCallID: s("c"), Name: s("f")},
			{Role: "user", Content: s("go on")},
		}, Completion: "long answer cut", FinishReason: "length", PromptTokens: 40, CompletionTokens: 100},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("parquet rows mismatch (-want +got):\n%s", diff)
	}
}

// TestParquetListShape checks messages use the standard 3-level LIST that
// pyarrow writes and datasets expects.
func TestParquetListShape(t *testing.T) {
	dir := t.TempDir()
	if _, err := Export(context.Background(), fixture(t), dir, []string{FormatParquet}, "j"); err != nil {
		t.Fatal(err)
	}
	pf := openParquet(t, filepath.Join(dir, "j.parquet"))
	schema := pf.Schema().String()
	for _, want := range []string{"group messages (LIST)", "repeated group list", "group element", "optional binary content (STRING)"} {
		if !strings.Contains(schema, want) {
			t.Errorf("schema lacks %q:\n%s", want, schema)
		}
	}
	for _, rg := range pf.Metadata().RowGroups {
		for _, c := range rg.Columns {
			if got := c.MetaData.Codec.String(); got != "ZSTD" {
				t.Errorf("column %v codec = %s, want ZSTD", c.MetaData.PathInSchema, got)
			}
		}
	}
}

// TestExportEveryIDOnce exports enough rows to span several Parquet row
// groups and checks every id appears exactly once in every format.
func TestExportEveryIDOnce(t *testing.T) {
	const n = 2500
	fs := &fakeStore{}
	var ids []string
	for i := range n {
		id := fmt.Sprintf("s%05d", i)
		ids = append(ids, id)
		switch i % 50 {
		case 7:
			fs.rows = append(fs.rows, store.Row{ID: id, Partition: "P", Lane: "l", State: store.Dead, Reason: "bad", Attempts: 1})
		case 9:
			r := doneRow(t, id, `{"messages":[{"role":"user","content":"q `+id+`"}]}`, llm.Result{Content: "", FinishReason: "stop"})
			r.State, r.Rule, r.Reason, r.Attempts = store.Rejected, "empty", "meh", 2
			fs.rows = append(fs.rows, r)
		default:
			fs.rows = append(fs.rows, doneRow(t, id, `{"messages":[{"role":"user","content":"q `+id+`"}]}`,
				llm.Result{Content: strings.Repeat("tok ", i%40) + "\n\"quoted\"", FinishReason: "stop", Usage: llm.Usage{PromptTokens: 3, CompletionTokens: i % 40}}))
		}
	}
	dir := t.TempDir()
	sum, err := Export(context.Background(), fs, dir, Formats, "big")
	if err != nil {
		t.Fatal(err)
	}
	if sum.Done+sum.Rejected+sum.Dead != n {
		t.Errorf("summary counts %d done + %d rejected + %d dead, want %d total", sum.Done, sum.Rejected, sum.Dead, n)
	}
	collect := func(file, key string) []string {
		var got []string
		for _, m := range readLines(t, filepath.Join(dir, file)) {
			got = append(got, m[key].(string))
		}
		return got
	}
	var done []string
	for _, r := range fs.rows {
		if r.State == store.Done {
			done = append(done, r.ID)
		}
	}
	pq, err := parquet.ReadFile[ParquetRow](filepath.Join(dir, "big.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	var pqIDs []string
	for _, r := range pq {
		pqIDs = append(pqIDs, r.ID)
	}
	batch := append(collect("big.openai-batch.jsonl", "custom_id"), collect("big.errors.jsonl", "custom_id")...)
	sort.Strings(batch)
	for name, tc := range map[string]struct{ got, want []string }{
		"sharegpt":     {collect("big.sharegpt.jsonl", "id"), done},
		"openai-batch": {batch, ids},
		"parquet":      {pqIDs, done},
	} {
		if diff := cmp.Diff(tc.want, tc.got); diff != "" {
			t.Errorf("%s ids mismatch (-want +got):\n%s", name, diff)
		}
	}
}

func TestExportAtomic(t *testing.T) {
	names := []string{"j.sharegpt.jsonl", "j.openai-batch.jsonl", "j.errors.jsonl", "j.parquet", "j.rejected.jsonl", "j.dead.jsonl"}
	tests := []struct {
		name  string
		store func() *fakeStore
		ctx   func() context.Context
		want  string
	}{
		{"store fails mid-read", func() *fakeStore { f := fixture(t); f.failAfter = 2; return f }, context.Background, "disk on fire"},
		{"store fails reading bad rows", func() *fakeStore { f := fixture(t); f.failBad = true; return f }, context.Background, "disk on fire"},
		{"corrupt stored result", func() *fakeStore {
			f := fixture(t)
			f.rows[1].Result.Response = []byte(`{"content":`)
			return f
		}, context.Background, "sample P1/a2: decode stored result"},
		{"canceled", func() *fakeStore { return fixture(t) }, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, n := range names {
				if err := os.WriteFile(filepath.Join(dir, n), []byte("previous\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Export(tt.ctx(), tt.store(), dir, Formats, "j")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Export error = %v, want one containing %q", err, tt.want)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range entries {
				got = append(got, e.Name())
				b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
				if string(b) != "previous\n" {
					t.Errorf("%s was replaced by a failed export: %q", e.Name(), b)
				}
			}
			want := append([]string(nil), names...)
			sort.Strings(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("directory after failed export (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExportNoPreviousLeavesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	f := fixture(t)
	f.failAfter = 1
	if _, err := Export(context.Background(), f, dir, Formats, "j"); err == nil {
		t.Fatal("Export succeeded, want error")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("failed export left %d files: %v", len(entries), entries)
	}
}

func TestExportUnknownFormat(t *testing.T) {
	if _, err := Export(context.Background(), fixture(t), t.TempDir(), []string{"csv"}, "j"); err == nil || !strings.Contains(err.Error(), `unknown format "csv"`) {
		t.Errorf("Export(csv) = %v, want unknown format error", err)
	}
}

func TestExportDeadAlways(t *testing.T) {
	dir := t.TempDir()
	sum, err := Export(context.Background(), fixture(t), dir, []string{FormatShareGPT}, "j")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range sum.Files {
		got = append(got, filepath.Base(f.Path))
	}
	if diff := cmp.Diff([]string{"j.sharegpt.jsonl", "j.rejected.jsonl", "j.dead.jsonl", "README.md", "j.manifest.json"}, got); diff != "" {
		t.Errorf("files mismatch (-want +got):\n%s", diff)
	}
}

func BenchmarkExport(b *testing.B) {
	fs := &fakeStore{}
	for i := range 2000 {
		fs.rows = append(fs.rows, doneRow(b, fmt.Sprintf("s%05d", i), `{"messages":[{"role":"system","content":"you are helpful"},{"role":"user","content":"`+strings.Repeat("question ", 50)+`"}]}`,
			llm.Result{Content: strings.Repeat("answer token ", 500), ReasoningContent: strings.Repeat("thinking ", 200), FinishReason: "stop", Usage: llm.Usage{PromptTokens: 120, CompletionTokens: 700}}))
	}
	for _, format := range Formats {
		b.Run(format, func(b *testing.B) {
			dir := b.TempDir()
			for b.Loop() {
				if _, err := Export(context.Background(), fs, dir, []string{format}, "bench"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fs.rows)), "ns/row")
		})
	}
}

// A temp file left by an exporter that was killed is removed by the next
// export; one belonging to a live process is left alone.
func TestExportRemovesStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, fmt.Sprintf(".stale.sharegpt.jsonl.tmp-%d", cmd.Process.Pid))
	live := filepath.Join(dir, fmt.Sprintf(".stale.sharegpt.jsonl.tmp-%d", os.Getppid()))
	for _, p := range []string{stale, live} {
		if err := os.WriteFile(p, []byte("{\"torn"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := &fakeStore{rows: []store.Row{doneRow(t, "a", `{"messages":[{"role":"user","content":"q"}]}`, llm.Result{Content: "x", FinishReason: "stop"})}}
	if _, err := Export(context.Background(), fs, dir, []string{FormatShareGPT}, "stale"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale temp file of a dead exporter still there (stat err %v)", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("temp file of a live process was removed: %v", err)
	}
}
