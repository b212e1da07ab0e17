package export

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
)

// withProvenance is a stored response record as dispatch writes it.
func withProvenance(t *testing.T, r llm.Result, p store.Provenance) []byte {
	t.Helper()
	b, err := json.Marshal(struct {
		llm.Result
		Provenance store.Provenance `json:"provenance"`
	}{r, p})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// With full metadata every record and every turn says where its answer
// came from; the manifest carries the store's fingerprint, generations and
// the servers' engine versions. Minimal metadata carries none of it.
func TestExportProvenance(t *testing.T) {
	seed := int64(7)
	p0 := store.Provenance{Generation: 2, Model: "other-model", Engine: "sglang", EngineVersion: "0.5.6",
		Sampling: json.RawMessage(`{"max_tokens":500,"temperature":1.3}`), Seed: &seed}
	p1 := p0
	p1.SystemFingerprint = "fp_9"
	u := llm.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}
	chat := `{"messages":[{"role":"user","content":"q"}],"turns":[{"input":[{"role":"user","content":"q2"}]}],"seed":7}`
	multi := turnRow(t, "P1/multi", chat, "",
		llm.Result{Content: "a0", FinishReason: "stop", Usage: u, Model: "other-model"},
		llm.Result{Content: "a1", FinishReason: "stop", Usage: u, Model: "other-model"})
	multi.Prior[0].Response = withProvenance(t, llm.Result{Content: "a0", FinishReason: "stop", Usage: u, Model: "other-model"}, p0)
	multi.Result.Response = withProvenance(t, llm.Result{Content: "a1", FinishReason: "stop", Usage: u, Model: "other-model"}, p1)
	// An answer stored before provenance: its generation is its column's.
	old := doneRow(t, "P1/old", `{"messages":[{"role":"user","content":"hi"}]}`, llm.Result{Content: "hello", FinishReason: "stop", Usage: u, Model: "m0"})
	old.Result.Generation = 1
	st := &fakeStore{rows: []store.Row{multi, old}, gens: []store.Generation{
		{N: 1, Fingerprint: "f1", Config: []byte(`{"model":"m0"}`), Superseded: 19},
		{N: 2, Fingerprint: "f2", Config: []byte(`{"model":"other-model"}`), ServedModel: "other-model"},
	}}

	dir := t.TempDir()
	sum, err := ExportWith(context.Background(), st, dir, []string{FormatShareGPT, FormatParquet}, "j", Options{Metadata: MetadataFull})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[int]int{1: 1, 2: 1}, sum.DoneByGeneration); diff != "" {
		t.Errorf("DoneByGeneration (-want +got):\n%s", diff)
	}
	type line struct {
		ID         string
		Provenance *store.Provenance
		Turns      []struct{ Provenance *store.Provenance }
	}
	lines := map[string]line{}
	b, err := os.ReadFile(filepath.Join(dir, DataDir, "j.sharegpt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var l line
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatal(err)
		}
		// sampling is JSON text in the line; compared as the object it holds
		samplingObject(t, l.Provenance)
		for _, tu := range l.Turns {
			samplingObject(t, tu.Provenance)
		}
		lines[l.ID] = l
	}
	if got := lines["P1/multi"]; got.Provenance == nil || !cmp.Equal(p1, *got.Provenance) ||
		len(got.Turns) != 2 || !cmp.Equal(p0, *got.Turns[0].Provenance) || !cmp.Equal(p1, *got.Turns[1].Provenance) {
		t.Errorf("multi-turn record's provenance = %+v, turns %+v; want %+v then %+v", got.Provenance, got.Turns, p0, p1)
	}
	if got := lines["P1/old"].Provenance; got == nil || !cmp.Equal(store.Provenance{Generation: 1, Model: "m0"}, *got) {
		t.Errorf("old record's provenance = %+v, want generation 1 from its column and the response's model", got)
	}

	rows, err := parquet.ReadFile[ParquetRow](filepath.Join(dir, DataDir, "j.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	g2 := int64(2)
	want := ParquetRow{Generation: &g2, Model: str("other-model"), Engine: str("sglang"), EngineVersion: str("0.5.6"),
		SystemFingerprint: str("fp_9"), Sampling: str(`{"max_tokens":500,"temperature":1.3}`)}
	got := rows[0]
	got = ParquetRow{Generation: got.Generation, Model: got.Model, Engine: got.Engine, EngineVersion: got.EngineVersion,
		SystemFingerprint: got.SystemFingerprint, Sampling: got.Sampling}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parquet provenance columns of %s (-want +got):\n%s", rows[0].ID, diff)
	}

	m := readManifest(t, dir, "j")
	var cfg bytes.Buffer
	if len(m.Generations) == 2 {
		json.Compact(&cfg, m.Generations[1].Config)
	}
	if m.Fingerprint != "f2" || m.Generation != 2 || len(m.Generations) != 2 ||
		m.Generations[0].Superseded != 19 || m.Generations[0].Done != 1 || m.Generations[1].Done != 1 ||
		m.Generations[1].ServedModel != "other-model" || cfg.String() != `{"model":"other-model"}` {
		t.Errorf("manifest fingerprint %q generation %d generations %+v", m.Fingerprint, m.Generation, m.Generations)
	}
	var servers []string
	for _, s := range m.Servers {
		servers = append(servers, s.Endpoint+" "+s.Engine+" "+s.EngineVersion)
	}
	if diff := cmp.Diff([]string{"http://127.0.0.1:30000 sglang 0.5.6", "http://127.0.0.1:30001 sglang 0.5.6"}, servers); diff != "" {
		t.Errorf("manifest servers (-want +got):\n%s", diff)
	}

	// Minimal metadata: no provenance in the training records.
	min := exportLines(t, []store.Row{multi}, Options{})
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(min["P1/multi"], &keys); err != nil {
		t.Fatal(err)
	}
	if _, ok := keys["provenance"]; ok {
		t.Errorf("minimal metadata record carries provenance: %s", min["P1/multi"])
	}
}

// samplingObject turns a line's sampling (JSON text) back into the object.
func samplingObject(t *testing.T, p *store.Provenance) {
	t.Helper()
	if p == nil || string(p.Sampling) == "null" {
		if p != nil {
			p.Sampling = nil
		}
		return
	}
	var text string
	if err := json.Unmarshal(p.Sampling, &text); err != nil {
		t.Fatalf("sampling %s: want JSON text: %v", p.Sampling, err)
	}
	p.Sampling = json.RawMessage(text)
}

// Every record carries the chat_template_kwargs its last answer's request
// sent, as JSON text, in both formats and whatever the metadata level:
// the switch set, "{}" when the request sent none, null when the stored
// answer does not record its request (issue 33 item 5).
func TestExportTemplateKwargs(t *testing.T) {
	u := llm.Usage{PromptTokens: 3, CompletionTokens: 1}
	row := func(id, sampling string) store.Row {
		r := doneRow(t, id, `{"messages":[{"role":"user","content":"q"}]}`, llm.Result{Content: "a", FinishReason: "stop", Usage: u})
		if sampling != "" {
			p := store.Provenance{Generation: 1, Sampling: json.RawMessage(sampling)}
			r.Result.Response = withProvenance(t, llm.Result{Content: "a", FinishReason: "stop", Usage: u}, p)
		}
		return r
	}
	st := &fakeStore{rows: []store.Row{
		row("P1/on", `{"chat_template_kwargs":{"thinking": true},"max_tokens":9}`),
		row("P1/none", `{"max_tokens":9}`),
		row("P1/old", ""),
	}}
	dir := t.TempDir()
	if _, err := ExportWith(context.Background(), st, dir, []string{FormatShareGPT, FormatParquet}, "j", Options{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]*string{"P1/on": ptr(`{"thinking":true}`), "P1/none": ptr("{}"), "P1/old": nil}
	got := map[string]*string{}
	for _, m := range readLines(t, filepath.Join(dir, DataDir, "j.sharegpt.jsonl")) {
		v, ok := m["chat_template_kwargs"]
		if !ok {
			t.Fatalf("line %v has no chat_template_kwargs key", m["id"])
		}
		if s, isStr := v.(string); isStr {
			got[m["id"].(string)] = &s
		} else {
			got[m["id"].(string)] = nil
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sharegpt chat_template_kwargs (-want +got):\n%s", diff)
	}
	rows, err := parquet.ReadFile[ParquetRow](filepath.Join(dir, DataDir, "j.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	got = map[string]*string{}
	for _, r := range rows {
		got[r.ID] = r.ChatTemplateKwargs
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parquet chat_template_kwargs (-want +got):\n%s", diff)
	}
}

func ptr(s string) *string { return &s }

// With token ids the same rows (none has ids) go to the no-token-ids
// files; the export's own verify reads the Parquet one in its schema and
// finds every row equal (read as a token row, parquet-go filled input_ids
// from another column once chat_template_kwargs was set).
func TestExportTemplateKwargsNoIDs(t *testing.T) {
	u := llm.Usage{PromptTokens: 3, CompletionTokens: 1}
	r := doneRow(t, "P1/on", `{"messages":[{"role":"user","content":"q"}]}`, llm.Result{Content: "a", FinishReason: "stop", Usage: u})
	p := store.Provenance{Generation: 1, Sampling: json.RawMessage(`{"chat_template_kwargs":{"thinking":true}}`)}
	r.Result.Response = withProvenance(t, llm.Result{Content: "a", FinishReason: "stop", Usage: u}, p)
	sum, err := ExportWith(context.Background(), &fakeStore{rows: []store.Row{r}}, t.TempDir(), []string{FormatParquet}, "j", Options{TokenIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	if sum.TokenIDsUnavailable != 1 || sum.Verified.Records != 1 {
		t.Errorf("unavailable %d, verified records %d; want 1 and 1", sum.TokenIDsUnavailable, sum.Verified.Records)
	}
}
