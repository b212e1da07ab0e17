package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

// filesCaptures is a store.Captures listing fixed files.
type filesCaptures struct {
	store.Captures
	files []store.CapturedFile
}

func (f filesCaptures) EachCapturedFile(_ context.Context, fn func(store.CapturedFile) error) error {
	return eachOf(f.files, fn)
}

// eachOf calls fn on each item in order, up to its first error: the walk
// of the fixed-list store fakes.
func eachOf[T any](items []T, fn func(T) error) error {
	for _, it := range items {
		if err := fn(it); err != nil {
			return err
		}
	}
	return nil
}

// TestLayoutFor: the job's capture section wins, then the captured files,
// then the model's config.json (a folder holding one), then the defaults;
// the source names each, and no hidden size at all is ErrNoLayout.
func TestLayoutFor(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "model"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := `{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"intermediate_size":14336,"torch_dtype":"float16"}`
	if err := os.WriteFile(filepath.Join(dir, "model", "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	captured := filesCaptures{files: []store.CapturedFile{{Layers: 3, Hidden: 2048, DType: "f32"}}}
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		model  string
		cap    job.Capture
		caps   store.Captures
		want   Layout
		source []string
		err    error
	}{
		{"job section", "model", job.Capture{Layers: 5, Hidden: 1024, DType: "bf16"}, captured, Layout{Layers: 5, Hidden: 1024, DType: "bf16"}, []string{"the job's capture section"}, nil},
		{"captured files", "model", job.Capture{}, captured, Layout{Layers: 3, Hidden: 2048, DType: "f32"}, []string{"the captured files"}, nil},
		{"job layers, file rest", "model", job.Capture{Layers: 2}, captured, Layout{Layers: 2, Hidden: 2048, DType: "f32"}, []string{"capture section", "captured files"}, nil},
		{"model config", "model", job.Capture{}, filesCaptures{}, Layout{Layers: DefaultLayers, Hidden: 4096, DType: "f16"}, []string{"model/config.json", "4 layers assumed"}, nil},
		{"no store yet", "model/config.json", job.Capture{Layers: 4}, nil, Layout{Layers: 4, Hidden: 4096, DType: "f16"}, []string{"capture section", "model/config.json"}, nil},
		{"nothing known", "org/remote-model", job.Capture{}, filesCaptures{}, Layout{Layers: DefaultLayers, DType: "bf16"}, []string{"bf16 assumed"}, ErrNoLayout},
	} {
		spec := &job.Spec{Dir: dir, Model: c.model, Capture: &c.cap}
		got, err := LayoutFor(ctx, c.caps, spec)
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		}
		src := got.Source
		got.Source = ""
		if got != c.want {
			t.Errorf("%s: layout %+v, want %+v", c.name, got, c.want)
		}
		for _, s := range c.source {
			if !strings.Contains(src, s) {
				t.Errorf("%s: source %q does not name %q", c.name, src, s)
			}
		}
	}
}

// TestEstimateJobCountsCurrentCaptures: the bytes already captured that
// the estimate subtracts are those of files holding a current row's ids;
// a file recorded for other ids (the row regenerated since) or for a key
// no row has any more is captured again or never listed, so it is not
// subtracted.
func TestEstimateJobCountsCurrentCaptures(t *testing.T) {
	ctx := context.Background()
	st := doneStore(t, 3) // p/s001 and p/s002 have conversation ids; p/s000 re-renders
	var keys []store.CaptureKey
	must(t, st.Finished(ctx, func(row store.Row) error {
		items, _, err := rowItems(row, false)
		for _, it := range items {
			keys = append(keys, it.CaptureKey)
		}
		return err
	}))
	if len(keys) != 2 {
		t.Fatalf("keys %v, want p/s001 and p/s002", keys)
	}
	stale := keys[1]
	stale.Input = "ids since regenerated"
	gone := store.CaptureKey{Key: "p/gone", SampleID: "p/gone", Turn: store.WholeConversation, Input: keys[0].Input}
	for i, r := range []struct {
		k     store.CaptureKey
		bytes int64
	}{{keys[0], 1000}, {stale, 2000}, {gone, 4000}} {
		c, ok, err := st.ClaimCapture(ctx, r.k, "w", time.Minute)
		if err != nil || !ok {
			t.Fatalf("claim %s: %v %v", r.k.Key, ok, err)
		}
		must(t, st.RecordCapture(ctx, c, store.CapturedFile{CaptureKey: r.k, Path: fmt.Sprintf("h/%d.safetensors", i), Bytes: r.bytes, SHA256: "x", Tokens: 10, Layers: 2, Hidden: 8, DType: "bf16"}))
	}
	dir := t.TempDir()
	spec := &job.Spec{Dir: dir, Capture: &job.Capture{Dir: filepath.Join(dir, "h"), Layers: 2, Hidden: 8, DType: "bf16"}}
	e, err := EstimateJob(ctx, st, spec)
	must(t, err)
	if e.Captured != 1 || e.CapturedBytes != 1000 {
		t.Errorf("estimate subtracts %d files of %d bytes; want p/s001's alone (1 file, 1000 bytes)", e.Captured, e.CapturedBytes)
	}
}

// TestFromJobNamesEmptyKeyVariable: a capture endpoint whose api_key_env
// names an empty variable is refused naming the field and its line in the
// job file.
func TestFromJobNamesEmptyKeyVariable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	must(t, os.WriteFile(path, []byte(`name: cap
model: m
endpoints: [{url: "http://127.0.0.1:1"}]
sources: [{partition: p, path: data.jsonl, prompt: prompt}]
lanes: [{name: short, concurrency: 8, max_tokens: 4096}]
output: {token_ids: true}
capture:
  endpoints:
    - url: "http://127.0.0.1:2"
    - url: "http://127.0.0.1:3"
      api_key_env: REGEN_TEST_CAPTURE_KEY_UNSET
`), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "data.jsonl"), []byte(`{"prompt":"q"}`+"\n"), 0o644))
	t.Setenv("REGEN_TEST_CAPTURE_KEY_UNSET", "")
	spec, err := job.Load(path)
	must(t, err)
	_, err = FromJob(spec, "o", false, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "job.yaml:11") || !strings.Contains(err.Error(), "capture.endpoints[1].api_key_env") ||
		!strings.Contains(err.Error(), "REGEN_TEST_CAPTURE_KEY_UNSET is empty") {
		t.Fatalf("FromJob: %v; want job.yaml:11, the field and the variable named", err)
	}
}
