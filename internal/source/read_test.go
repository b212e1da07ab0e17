package source

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/job"
)

// got is a Sample with Body as a string, for readable diffs.
type got struct {
	ID     string
	Origin string
	Tokens int
	Body   string
}

func readAll(t *testing.T, o Options, src job.Source, baseDir string) ([]got, []BadRow, Stats, error) {
	t.Helper()
	var samples []got
	var bads []BadRow
	st, err := o.Read(context.Background(), src, baseDir, func(s Sample) error {
		if s.Partition != src.Partition {
			t.Errorf("sample %s partition = %q, want %q", s.ID, s.Partition, src.Partition)
		}
		samples = append(samples, got{s.ID, s.Origin, s.PromptTokens, requestPart(s.Body)})
		return nil
	}, func(b BadRow) error {
		bads = append(bads, b)
		return nil
	})
	return samples, bads, st, err
}

func TestReadMappings(t *testing.T) {
	tests := []struct {
		name string
		src  job.Source
		want []got
	}{{
		name: "sharegpt with glaive tools and system field, every turn regenerated",
		src:  job.Source{Partition: "B1", Path: "sharegpt.jsonl", Conversations: "conversations", Tools: "tools", ID: "id", SystemField: "system"},
		want: []got{
			{"B1/g1", "testdata/sharegpt.jsonl:1", 63, `{"messages":[{"role":"system","content":"You can call functions."},{"role":"user","content":"Weather in Oslo?"}],"tools":[{"function":{"description":"Weather for a city","name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}]}`},
			// Empty system and tools mean none; both gpt turns are regenerated: turn 1's input is the second question; no HTML escaping.
			{"B1/g2", "testdata/sharegpt.jsonl:2", 4, `{"messages":[{"role":"user","content":"Hi"}],"turns":[{"input":[{"role":"user","content":"Tell me a joke about <tags> & \"quotes\"."}]}]}`},
			// A numeric id; the row's own system turn wins over the system field. The recorded
			// function_call becomes turn 1's calls, and the observation a tool result linked to it.
			{"B1/7", "testdata/sharegpt.jsonl:3", 34, `{"messages":[{"role":"system","content":"Own system."},{"role":"user","content":"Convert 10 USD"}],"tools":[{"function":{"name":"convert","parameters":{"type":"object"}},"type":"function"}],"turns":[{"calls":[{"id":"call_2","type":"function","function":{"name":"convert","arguments":"{\"amount\":10}"}}],"input":[{"role":"tool","content":"{\"eur\":9.2}","tool_call_id":"call_2"}]}]}`},
		},
	}, {
		name: "sharegpt, last turn only: the history keeps the dataset's turns, calls structured",
		src:  job.Source{Partition: "B1", Path: "sharegpt.jsonl", Conversations: "conversations", Tools: "tools", ID: "id", SystemField: "system", Regenerate: "last"},
		want: []got{
			{"B1/g1", "testdata/sharegpt.jsonl:1", 63, `{"messages":[{"role":"system","content":"You can call functions."},{"role":"user","content":"Weather in Oslo?"}],"tools":[{"function":{"description":"Weather for a city","name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}]}`},
			{"B1/g2", "testdata/sharegpt.jsonl:2", 23, `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"Tell me a joke about <tags> & \"quotes\"."}]}`},
			{"B1/7", "testdata/sharegpt.jsonl:3", 69, `{"messages":[{"role":"system","content":"Own system."},{"role":"user","content":"Convert 10 USD"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_2","type":"function","function":{"name":"convert","arguments":"{\"amount\":10}"}}]},{"role":"tool","content":"{\"eur\":9.2}","tool_call_id":"call_2"}],"tools":[{"function":{"name":"convert","parameters":{"type":"object"}},"type":"function"}]}`},
		},
	}, {
		name: "openai messages without id",
		src:  job.Source{Partition: "O", Path: "openai.jsonl", Messages: "messages"},
		want: []got{
			{"O/8a8ee13d475d9c0182f63c8b853217c2", "testdata/openai.jsonl:1", 13, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is 2+2?"}]}`},
			{"O/0e384b2efd7e1d56a08c9d06dd72dfa7", "testdata/openai.jsonl:2", 6, `{"messages":[{"role":"user","content":"Weather?"}],"turns":[{"calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}],"input":[{"role":"tool","content":"sunny","name":"w","tool_call_id":"c1"}]}]}`},
			{"O/593e8883743635c53ad9d12d85641a64", "testdata/openai.jsonl:3", 12, `{"messages":[{"role":"user","content":[{"text":"parts","type":"text"}]}]}`},
		},
	}, {
		// Bodies (and so hash ids) are the ones regen wrote before multi-turn regeneration.
		name: "openai messages, last turn only",
		src:  job.Source{Partition: "O", Path: "openai.jsonl", Messages: "messages", Regenerate: "last"},
		want: []got{
			{"O/8a8ee13d475d9c0182f63c8b853217c2", "testdata/openai.jsonl:1", 13, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is 2+2?"}]}`},
			{"O/b92a0f1882287a2c6c51afbf4e5286f2", "testdata/openai.jsonl:2", 33, `{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"function":{"arguments":"{}","name":"w"},"id":"c1","type":"function"}]},{"role":"tool","content":"sunny","name":"w","tool_call_id":"c1"}]}`},
			{"O/593e8883743635c53ad9d12d85641a64", "testdata/openai.jsonl:3", 12, `{"messages":[{"role":"user","content":[{"text":"parts","type":"text"}]}]}`},
		},
	}, {
		name: "plain prompt with literal system and numeric ids",
		src:  job.Source{Partition: "P", Path: "prompt.jsonl", Prompt: "input", ID: "task_id", System: "You write code."},
		want: []got{
			{"P/1", "testdata/prompt.jsonl:1", 21, `{"messages":[{"role":"system","content":"You write code."},{"role":"user","content":"Write a function that reverses a string."}]}`},
			{"P/2", "testdata/prompt.jsonl:2", 16, `{"messages":[{"role":"system","content":"You write code."},{"role":"user","content":"Sort a list in Go."}]}`},
			{"P/3.5", "testdata/prompt.jsonl:3", 14, `{"messages":[{"role":"system","content":"You write code."},{"role":"user","content":"Parse JSON."}]}`},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			samples, bads, st, err := readAll(t, Options{}, tt.src, "testdata")
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if len(bads) != 0 {
				t.Errorf("bad rows: %+v", bads)
			}
			if diff := cmp.Diff(tt.want, samples); diff != "" {
				t.Errorf("samples mismatch (-want +got):\n%s", diff)
			}
			wantStats := Stats{Files: 1, Rows: len(tt.want), Good: len(tt.want)}
			if st != wantStats {
				t.Errorf("stats = %+v, want %+v", st, wantStats)
			}
		})
	}
}

// badFile copies testdata/bad.jsonl into a temp dir and appends a 2 MiB
// (valid) row and one more good row; it also adds an empty file.
func badFile(t *testing.T) (dir string) {
	t.Helper()
	dir = t.TempDir()
	b, err := os.ReadFile("testdata/bad.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	huge := `{"id":"huge","conversations":[{"from":"human","value":"` + strings.Repeat("x", 2<<20) + `"}]}`
	b = append(b, huge+"\n"+`{"id":"ok3","conversations":[{"from":"human","value":"after the huge line"}]}`...) // no final newline
	if err := os.WriteFile(filepath.Join(dir, "bad.jsonl"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty.jsonl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReadBadRows(t *testing.T) {
	dir := badFile(t)
	src := job.Source{Partition: "X", Path: ".", Conversations: "conversations", Tools: "tools", ID: "id"}
	samples, bads, st, err := readAll(t, Options{MaxLineBytes: 1 << 20}, src, dir)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	p := dir + "/bad.jsonl:"
	wantBad := []BadRow{
		{"X", p + "2", "", "malformed JSON at byte 67: unexpected end of line"},
		{"X", p + "3", "id", "field id: missing"},
		{"X", p + "4", "conversations", "field conversations: want array, got string"},
		// line 5 is blank: skipped, not a row
		{"X", p + "6", "conversations", "field conversations: empty conversation"},
		{"X", p + "7", "conversations[0].value", "field conversations[0].value: empty content"},
		{"X", p + "8", "conversations[1].from", `field conversations[1].from: unknown role "wizard"`},
		{"X", p + "9", "tools", "field tools: bad tools JSON: malformed JSON at byte 11: invalid character 'b' looking for beginning of value"},
		{"X", p + "10", "tools[0]", "field tools[0]: want a tool object {type, function} or a function schema with name"},
		{"X", p + "11", "id", "field id: empty id"},
		{"X", p + "12", "", "row: want object, got array"},
		{"X", p + "13", "conversations[0].value", "field conversations[0].value: want string, got null"},
		{"X", p + "14", "conversations", "field conversations: empty conversation"},
		{"X", p + "16", "", fmt.Sprintf("line longer than 1048576 bytes (%d bytes)", 2<<20+59)},
	}
	if diff := cmp.Diff(wantBad, bads); diff != "" {
		t.Errorf("bad rows mismatch (-want +got):\n%s", diff)
	}
	var ids, origins []string
	for _, s := range samples {
		ids = append(ids, s.ID)
		origins = append(origins, s.Origin)
	}
	if diff := cmp.Diff([]string{"X/ok1", "X/ok2", "X/ok3"}, ids); diff != "" {
		t.Errorf("good ids mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{p + "1", p + "15", p + "17"}, origins); diff != "" {
		t.Errorf("good origins mismatch (-want +got):\n%s", diff)
	}
	if want := (Stats{Files: 2, Rows: 16, Good: 3, Bad: 13}); st != want {
		t.Errorf("stats = %+v, want %+v", st, want)
	}

	// Under the default 64 MiB cap the 2 MiB line is an ordinary row.
	samples, _, _, err = readAll(t, Options{}, src, dir)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(samples) != 4 || samples[2].ID != "X/huge" || samples[2].Tokens != (2<<20)/4+4 {
		t.Errorf("default cap: got %d samples, third %q tokens %d; want 4, X/huge, %d", len(samples), samples[2].ID, samples[2].Tokens, (2<<20)/4+4)
	}
}

// genPromptRows writes n prompt rows without ids to a JSONL file, in the order perm gives.
func genPromptRows(t *testing.T, path string, n int, perm []int) {
	t.Helper()
	var b bytes.Buffer
	for _, i := range perm {
		fmt.Fprintf(&b, `{"q":"question number %d","sys":"s%d"}`+"\n", i, i%3)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestIDsStableAcrossRowOrder(t *testing.T) {
	dir := t.TempDir()
	const n = 200
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	genPromptRows(t, filepath.Join(dir, "a.jsonl"), n, order)
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	genPromptRows(t, filepath.Join(dir, "b.jsonl"), n, order)

	idsOf := func(file string) map[string]string {
		src := job.Source{Partition: "H", Path: file, Prompt: "q", SystemField: "sys"}
		samples, bads, _, err := readAll(t, Options{}, src, dir)
		if err != nil || len(bads) != 0 {
			t.Fatalf("Read %s: %v, bad rows %v", file, err, bads)
		}
		m := map[string]string{}
		for _, s := range samples {
			m[s.ID] = s.Body
		}
		return m
	}
	a, b := idsOf("a.jsonl"), idsOf("b.jsonl")
	if len(a) != n {
		t.Fatalf("got %d distinct ids, want %d", len(a), n)
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("ids differ between row orders (-ordered +shuffled):\n%s", diff)
	}
	// Another partition with the same content gets other ids.
	src := job.Source{Partition: "H2", Path: "a.jsonl", Prompt: "q", SystemField: "sys"}
	samples, _, _, _ := readAll(t, Options{}, src, dir)
	if _, ok := a["H"+samples[0].ID[2:]]; ok {
		t.Errorf("partition H2 reused H's content hash %s", samples[0].ID)
	}
}

func writeGzip(t *testing.T, path string, data []byte) {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

type promptRow struct {
	ID    string `parquet:"id"`
	Input string `parquet:"input"`
}

func writeParquet[T any](t *testing.T, path string, rows []T) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := parquet.NewGenericWriter[T](f)
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestReadDirGlobGzipFormat(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.jsonl"), []byte(`{"id":"a1","input":"from a"}`+"\n"), 0o644)
	writeGzip(t, filepath.Join(dir, "b.jsonl.gz"), []byte(`{"id":"b1","input":"from b"}`+"\n"+`{"id":"b2","input":"from b again"}`+"\n"))
	writeParquet(t, filepath.Join(dir, "c.parquet"), []promptRow{{"c1", "from c"}})
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not data"), 0o644)
	writeGzip(t, filepath.Join(dir, "rows.data"), []byte(`{"id":"d1","input":"named oddly, gzipped"}`))

	tests := []struct {
		name, path, format string
		want               []string // origins
	}{
		{"directory", ".", "", []string{"a.jsonl:1", "b.jsonl.gz:1", "b.jsonl.gz:2", "c.parquet:row 0"}},
		{"glob", "*.jsonl*", "", []string{"a.jsonl:1", "b.jsonl.gz:1", "b.jsonl.gz:2"}},
		{"gzip file", "b.jsonl.gz", "", []string{"b.jsonl.gz:1", "b.jsonl.gz:2"}},
		{"format overrides the name", "rows.data", "jsonl", []string{"rows.data:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := job.Source{Partition: "D", Path: tt.path, Format: tt.format, Prompt: "input", ID: "id"}
			samples, bads, _, err := readAll(t, Options{}, src, dir)
			if err != nil || len(bads) != 0 {
				t.Fatalf("Read: %v, bad rows %v", err, bads)
			}
			var origins []string
			for _, s := range samples {
				origins = append(origins, strings.TrimPrefix(s.Origin, dir+"/"))
			}
			if diff := cmp.Diff(tt.want, origins); diff != "" {
				t.Errorf("origins mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// Message and pqRow have the shape pyarrow writes for HF datasets: a
// 3-level LIST of structs with optional fields, and plain string columns.
type pqMessage struct {
	Role    string  `parquet:"role"`
	Content *string `parquet:"content,optional"`
}

type pqRow struct {
	ID       string      `parquet:"id"`
	System   *string     `parquet:"system,optional"`
	Tools    *string     `parquet:"tools,optional"`
	Messages []pqMessage `parquet:"messages,optional,list"`
	Prompt   string      `parquet:"prompt"`
}

func TestReadParquet(t *testing.T) {
	dir := t.TempDir()
	str := func(s string) *string { return &s }
	rows := []pqRow{
		{ID: "r0", System: str("Be exact."), Tools: str(`[{"name":"calc","parameters":{"type":"object"}}]`),
			Messages: []pqMessage{{"user", str("2+2?")}, {"assistant", nil}}, Prompt: "p0"},
		{ID: "r1", Messages: []pqMessage{{"user", str("hi")}}, Prompt: "p1"},
		{ID: "r2", Prompt: "p2"}, // messages null
		{ID: "", Messages: []pqMessage{{"user", str("no id")}}, Prompt: ""},
	}
	// Enough rows to cross several read batches.
	for i := 4; i < 150; i++ {
		rows = append(rows, pqRow{ID: fmt.Sprintf("r%d", i), Messages: []pqMessage{{"user", str(fmt.Sprint("q", i))}}, Prompt: fmt.Sprint("p", i)})
	}
	path := filepath.Join(dir, "d.parquet")
	writeParquet(t, path, rows)

	src := job.Source{Partition: "Q", Path: "d.parquet", Messages: "messages", SystemField: "system", Tools: "tools", ID: "id"}
	samples, bads, st, err := readAll(t, Options{}, src, dir)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	wantHead := []got{
		// Tokens: (9+4 bytes of content + 78 of tools JSON)/4 + 2 messages*4.
		{"Q/r0", path + ":row 0", 31, `{"messages":[{"role":"system","content":"Be exact."},{"role":"user","content":"2+2?"}],"tools":[{"function":{"name":"calc","parameters":{"type":"object"}},"type":"function"}]}`},
		{"Q/r1", path + ":row 1", 4, `{"messages":[{"role":"user","content":"hi"}]}`},
	}
	if diff := cmp.Diff(wantHead, samples[:2]); diff != "" {
		t.Errorf("samples mismatch (-want +got):\n%s", diff)
	}
	wantBad := []BadRow{
		{"Q", path + ":row 2", "messages", "field messages: missing"},
		{"Q", path + ":row 3", "id", "field id: empty id"},
	}
	if diff := cmp.Diff(wantBad, bads); diff != "" {
		t.Errorf("bad rows mismatch (-want +got):\n%s", diff)
	}
	if want := (Stats{Files: 1, Rows: 150, Good: 148, Bad: 2}); st != want {
		t.Errorf("stats = %+v, want %+v", st, want)
	}
	if last := samples[len(samples)-1]; last.ID != "Q/r149" || last.Origin != path+":row 149" {
		t.Errorf("last sample = %s at %s, want Q/r149 at %s:row 149", last.ID, last.Origin, path)
	}

	// Plain string column as the prompt.
	src = job.Source{Partition: "Q", Path: "d.parquet", Prompt: "prompt", ID: "id", Limit: 1}
	samples, _, _, err = readAll(t, Options{}, src, dir)
	if err != nil || len(samples) != 1 || samples[0].Body != `{"messages":[{"role":"user","content":"p0"}]}` {
		t.Errorf("prompt column: got %+v, %v", samples, err)
	}

	// A mapped column the file lacks is a job error, not a bad row per row.
	src = job.Source{Partition: "Q", Path: "d.parquet", Prompt: "question"}
	_, _, _, err = readAll(t, Options{}, src, dir)
	if err == nil || !strings.Contains(err.Error(), `no column "question"`) {
		t.Errorf("missing column: err = %v, want one naming the column", err)
	}
}

func TestReadPathErrors(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "nodata"), 0o755)
	os.WriteFile(filepath.Join(dir, "nodata", "x.csv"), []byte("a,b"), 0o644)
	os.WriteFile(filepath.Join(dir, "rows.csv"), []byte("a,b"), 0o644)
	os.WriteFile(filepath.Join(dir, "broken.parquet"), []byte("not parquet at all"), 0o644)
	writeGzip(t, filepath.Join(dir, "cut.jsonl.gz"), bytes.Repeat([]byte(`{"p":"a row"}`+"\n"), 1000))
	gz, _ := os.ReadFile(filepath.Join(dir, "cut.jsonl.gz"))
	os.WriteFile(filepath.Join(dir, "cut.jsonl.gz"), gz[:len(gz)-12], 0o644)
	tests := []struct{ path, want string }{
		{"missing.jsonl", "missing.jsonl: no such file"},
		{"*.nothing", "*.nothing: no files match"},
		{"nodata", "nodata: no *.jsonl, *.jsonl.gz or *.parquet files"},
		{"rows.csv", "rows.csv: cannot tell the format"},
		{"broken.parquet", "open parquet " + filepath.Join(dir, "broken.parquet")},
		{"cut.jsonl.gz", "cut.jsonl.gz line 1001: corrupt data: unexpected EOF"},
	}
	_, _, _, err := readAll(t, Options{}, job.Source{Partition: "E", Path: "x.jsonl", Prompt: "p", Messages: "m"}, dir)
	if err == nil || !strings.Contains(err.Error(), "map exactly one of") {
		t.Errorf("two mappings: err = %v, want one naming the rule", err)
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			_, _, _, err := readAll(t, Options{}, job.Source{Partition: "E", Path: tt.path, Prompt: "p"}, dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestReadLimitAndStops(t *testing.T) {
	src := job.Source{Partition: "X", Path: "bad.jsonl", Conversations: "conversations", ID: "id", Limit: 1}
	samples, bads, st, err := readAll(t, Options{}, src, "testdata")
	if err != nil || len(samples) != 1 || len(bads) != 0 || st.Rows != 1 {
		t.Errorf("limit 1: samples %d, bad %d, stats %+v, err %v; want 1, 0, 1 row, nil", len(samples), len(bads), st, err)
	}

	src.Limit = 0
	stop := errors.New("store full")
	_, err = Read(context.Background(), src, "testdata", func(Sample) error { return stop }, func(BadRow) error { return nil })
	if !errors.Is(err, stop) || !strings.Contains(err.Error(), "testdata/bad.jsonl:1") {
		t.Errorf("emit error: err = %v, want store full at testdata/bad.jsonl:1", err)
	}
	_, err = Read(context.Background(), src, "testdata", func(Sample) error { return nil }, func(BadRow) error { return stop })
	if !errors.Is(err, stop) || !strings.Contains(err.Error(), "testdata/bad.jsonl:2") {
		t.Errorf("bad error: err = %v, want store full at testdata/bad.jsonl:2", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Read(ctx, src, "testdata", func(Sample) error { return nil }, func(BadRow) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: err = %v, want context.Canceled", err)
	}
}

// An empty JSONL file has no rows; an empty Parquet file is no Parquet
// file (one with no rows still has its footer) and is refused by name, as
// a truncated one is.
func TestReadEmptyFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "empty.jsonl"), nil, 0o644)
	_, _, st, err := readAll(t, Options{}, job.Source{Partition: "E", Path: "empty.jsonl", Prompt: "p"}, dir)
	if want := (Stats{Files: 1}); err != nil || st != want {
		t.Errorf("empty.jsonl: stats %+v, err %v; want %+v, nil", st, err, want)
	}
	os.WriteFile(filepath.Join(dir, "empty.parquet"), nil, 0o644)
	_, _, _, err = readAll(t, Options{}, job.Source{Partition: "E", Path: "empty.parquet", Prompt: "p"}, dir)
	if want := "open parquet " + filepath.Join(dir, "empty.parquet") + ": empty file (0 bytes)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("empty.parquet: err %v, want one containing %q", err, want)
	}
}

func TestFilesSorted(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"c.jsonl", "a.parquet", "b.jsonl.gz", "skip.json"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o644)
	}
	files, err := Files(job.Source{Partition: "F", Path: dir}, "/elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.parquet"), filepath.Join(dir, "b.jsonl.gz"), filepath.Join(dir, "c.jsonl")}
	if !slices.Equal(files, want) {
		t.Errorf("Files = %v, want %v", files, want)
	}
}
