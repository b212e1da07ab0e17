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

	"github.com/nlpodyssey/safetensors"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
	"github.com/regen-dev/regen/internal/testfs"
)

// TestFileBytesCoversRealFiles writes files with the library and checks the
// estimate is never below a real file's size and over it by at most the
// header allowance.
func TestFileBytesCoversRealFiles(t *testing.T) {
	for _, c := range []struct {
		tokens, layers, hidden int
		dtype                  safetensors.DType
	}{{1, 1, 1, safetensors.BF16}, {12, 3, 40, safetensors.BF16}, {300, 4, 64, safetensors.F32}, {77, 2, 96, safetensors.F16}} {
		f := goodFile(ids(c.tokens), c.layers, c.hidden)
		f.dtype = c.dtype
		path := filepath.Join(t.TempDir(), "hs.safetensors")
		f.write(t, path)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		est := FileBytes(c.tokens, Layout{Layers: c.layers, Hidden: c.hidden, DType: c.dtype.String()})
		if est < st.Size() || est-st.Size() > HeaderBytes {
			t.Errorf("%+v: FileBytes = %d, real file %d bytes: want real <= estimate <= real+%d", c, est, st.Size(), HeaderBytes)
		}
	}
}

// rowsDataset is a store.Dataset over fixed rows.
type rowsDataset struct {
	store.Dataset
	rows []store.Row
}

func (d rowsDataset) Finished(_ context.Context, fn func(store.Row) error) error {
	return eachOf(d.rows, fn)
}

func TestEstimateStore(t *testing.T) {
	turn := func(p, c int) store.Result { return store.Result{PromptTokens: p, CompletionTokens: c} }
	ds := rowsDataset{rows: []store.Row{
		{ID: "a", State: store.Done, Result: turn(100, 50)},
		{ID: "b", State: store.Done, Result: turn(400, 30), Prior: []store.Result{turn(100, 60), turn(200, 70)}},
		{ID: "c", State: store.Rejected, Result: turn(999, 999)},
		{ID: "d", State: store.Dead},
	}}
	l := Layout{Layers: 4, Hidden: 1024, DType: "bf16"}
	perToken := int64(8 + 4*1024*2)
	for _, c := range []struct {
		turnRows bool
		files    int
		tokens   int64
	}{
		{false, 2, 150 + 430},
		{true, 4, 150 + 160 + 270 + 430},
	} {
		e, err := EstimateStore(context.Background(), ds, c.turnRows, l)
		if err != nil {
			t.Fatal(err)
		}
		want := Estimate{Layout: l, Samples: 2, Files: c.files, Tokens: c.tokens, Bytes: c.tokens*perToken + int64(c.files)*HeaderBytes}
		if e != want {
			t.Errorf("turn rows %v: EstimateStore = %+v, want %+v", c.turnRows, e, want)
		}
	}
}

func TestEstimateNeed(t *testing.T) {
	e := Estimate{Layout: Layout{Layers: 4, Hidden: 7168, DType: "bf16"}, Samples: 88000, Files: 88000, Tokens: 22_000_000,
		Dir: "/data/hs", FreeBytes: 412_000_000_000}
	e.Bytes = FileBytes(250, e.Layout) * 88000
	got := e.Need()
	want := "needs 1.3 TB for 88,000 samples (22,000,000 tokens x 4 layers x 7168 hidden x 2 bytes bf16, + 5% margin); /data/hs has 412 GB free"
	if got != want || e.Fits() {
		t.Errorf("Need() = %q (fits %v), want %q and not fitting", got, e.Fits(), want)
	}
	e.Files, e.Captured, e.CapturedBytes = 90000, 10, 1_000_000_000_000
	got = e.Need()
	want = "needs 275 GB for 88,000 samples (90,000 turn rows) (22,000,000 tokens x 4 layers x 7168 hidden x 2 bytes bf16, less 1.0 TB already captured in 10 files, + 5% margin); /data/hs has 412 GB free"
	if got != want || !e.Fits() {
		t.Errorf("Need() = %q (fits %v), want %q and fitting", got, e.Fits(), want)
	}
}

// doneStore is a real SQLite store with n done single-turn samples of
// prompt+completion tokens each.
func doneSQLite(t *testing.T, n, prompt, completion int) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var samples []store.NewSample
	for i := range n {
		samples = append(samples, store.NewSample{ID: fmt.Sprintf("s%03d", i), Partition: "P", Lane: "l",
			Body: []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"q%d"}]}`, i)), Origin: fmt.Sprintf("in.jsonl:%d", i+1)})
	}
	if _, err := st.Ingest(ctx, samples); err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, "l", n, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		res := store.Result{Response: []byte(`{"content":"a"}`), FinishReason: "stop", PromptTokens: prompt, CompletionTokens: completion}
		if err := st.Complete(ctx, c.ID, "w", res); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// TestCheckRefusesOnSmallTmpfs estimates from a real store against a real
// 1 MB tmpfs: a capture that fits is allowed, one that does not is refused
// with the numbers, and filling the tmpfs turns the first into a refusal.
func TestCheckRefusesOnSmallTmpfs(t *testing.T) {
	fsDir := testfs.Tmpfs(t, 1<<20)
	dir := filepath.Join(fsDir, "hidden") // not created yet: measured on its parent
	l := Layout{Layers: 2, Hidden: 64, DType: "bf16"}
	per := FileBytes(300, l) // 300 tokens: 79,056 bytes a file
	ctx := context.Background()

	fits, err := EstimateStore(ctx, doneSQLite(t, 10, 200, 100), false, l)
	if err != nil {
		t.Fatal(err)
	}
	fits.Dir = dir
	if fits.Bytes != 10*per {
		t.Fatalf("estimate %d bytes, want 10 x %d", fits.Bytes, per)
	}
	got, err := fits.Measure(dir)
	if err == nil {
		err = got.Refusal()
	}
	if err != nil {
		t.Fatalf("10 files of %d bytes on a 1 MB tmpfs: %v, want them to fit", per, err)
	}
	if got.FreeBytes != 1<<20 {
		t.Errorf("free space of an empty 1 MB tmpfs = %d, want %d", got.FreeBytes, 1<<20)
	}

	big, err := EstimateStore(ctx, doneSQLite(t, 13, 200, 100), false, l)
	if err != nil {
		t.Fatal(err)
	}
	big.Dir = dir
	if big, err = big.Measure(dir); err != nil {
		t.Fatal(err)
	}
	err = big.Refusal()
	var se *SpaceError
	want := "hidden-state capture needs 1.1 MB for 13 samples (3,900 tokens x 2 layers x 64 hidden x 2 bytes bf16, + 5% margin); " + dir + " has 1.0 MB free"
	if !errors.As(err, &se) || err.Error() != want {
		t.Fatalf("13 files of %d bytes on a 1 MB tmpfs: %v, want a SpaceError %q", per, err, want)
	}

	if err := os.WriteFile(filepath.Join(fsDir, "ballast"), make([]byte, 400<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if fits, err = fits.Measure(dir); err != nil {
		t.Fatal(err)
	}
	if err := fits.Refusal(); !errors.As(err, &se) || !strings.Contains(err.Error(), "has 639 kB free") {
		t.Fatalf("after 400 KiB of ballast: %v, want a SpaceError naming 639 kB free (1,048,576 - 409,600 bytes)", err)
	}
}

// TestRunJobRechecksOnceTheFirstFileFixesTheLayout: a job without a hidden
// size (none in the job, no file yet, no local config.json) starts without
// a storage preflight; the first file recorded fixes the layout (4 layers
// of 4096 bf16 from the server, about 330 kB a file), and the preflight
// then refuses with the numbers: 30 files do not fit a 2 MB tmpfs. Only
// that first file is written.
func TestRunJobRechecksOnceTheFirstFileFixesTheLayout(t *testing.T) {
	fsDir := testfs.Tmpfs(t, 2<<20)
	url, _ := capSim(t, "", 0, func(c *sim.Config) { c.HiddenSize, c.HiddenLayers = 4096, 4 })
	st := doneStore(t, 30)
	dir := t.TempDir()
	spec := &job.Spec{Name: "j", Dir: dir, Path: filepath.Join(dir, "job.yaml"), Model: "org/remote-model",
		Capture: &job.Capture{Endpoints: []job.CaptureEndpoint{{URL: url}}, Dir: filepath.Join(fsDir, "h"), Concurrency: 1, MaxAttempts: 2, FileWait: 5 * time.Second}}
	if _, err := Preflight(context.Background(), st, spec); !errors.Is(err, ErrNoLayout) {
		t.Fatalf("preflight before any file: %v, want ErrNoLayout", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := RunJob(ctx, spec, st, nil)
	var se *SpaceError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "4 layers x 4096 hidden x 2 bytes bf16") || !strings.Contains(err.Error(), "free") {
		t.Fatalf("RunJob: %v (summary %+v); want the preflight's refusal with the numbers once the first file fixed the layout", err, sum)
	}
	if sum.Captured != 1 {
		t.Errorf("%d files captured before the refusal, want 1 (the one that fixed the layout)", sum.Captured)
	}
	t.Logf("refusal after the first file: %v", err)
}
