package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var describeFixture = Describe{
	RegenVersion:  "v0.0.0-test",
	Job:           JobInfo{Name: "demo", File: "../job.yaml", Model: "sim-model", Engine: "sim"},
	Configuration: json.RawMessage(`{"model":"sim-model"}`),
	Now:           time.Date(2026, 12, 4, 1, 2, 3, 0, time.UTC),
}

// readManifest reads dir's manifest and checks every file it lists against
// the disk: size, SHA-256 and, for JSONL, the line count.
func readManifest(t *testing.T, dir, name string) Manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name+".manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	for _, f := range m.Files {
		data, err := os.ReadFile(filepath.Join(dir, f.Path))
		if err != nil {
			t.Errorf("manifest names %s: %v", f.Path, err)
			continue
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != f.SHA256 || int64(len(data)) != f.Bytes {
			t.Errorf("%s: sha256 %s, %d bytes on disk; manifest says %s, %d", f.Path, got, len(data), f.SHA256, f.Bytes)
		}
		if strings.HasSuffix(f.Path, ".jsonl") {
			if n := strings.Count(string(data), "\n"); n != f.Rows {
				t.Errorf("%s: %d lines, manifest says %d rows", f.Path, n, f.Rows)
			}
		}
	}
	return m
}

// TestManifestAndCard: the manifest lists every file with its checksum and
// rows, the store's counts and token percentiles and the servers of the
// stored answers; the card is the golden one.
func TestManifestAndCard(t *testing.T) {
	dir := t.TempDir()
	sum, err := ExportWith(context.Background(), fixture(t), dir, Formats, "demo", Options{Describe: describeFixture})
	if err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, dir, "demo")
	var paths []string
	for _, f := range m.Files {
		paths = append(paths, f.Path)
	}
	want := []string{"demo.sharegpt.jsonl", "demo.openai-batch.jsonl", "demo.errors.jsonl", "demo.parquet", "demo.rejected.jsonl", "demo.dead.jsonl", "README.md"}
	if diff := cmp.Diff(want, paths); diff != "" {
		t.Errorf("manifest files (-want +got):\n%s", diff)
	}
	if m.Files[3].Rows != 3 {
		t.Errorf("parquet rows %d, want 3", m.Files[3].Rows)
	}
	if m.Schema != ManifestSchema || m.RegenVersion != "v0.0.0-test" || m.Fingerprint != "" || m.Generation != 0 {
		t.Errorf("schema %q version %q fingerprint %q generation %d", m.Schema, m.RegenVersion, m.Fingerprint, m.Generation)
	}
	wantTotals := Totals{Done: sum.Done, Truncated: sum.Truncated, Rejected: sum.Rejected, Dead: sum.Dead, BadRows: sum.BadRows}
	if diff := cmp.Diff(wantTotals, m.Totals); diff != "" {
		t.Errorf("totals (-want +got):\n%s", diff)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "demo.manifest.json"))
	for _, absent := range []string{`"fingerprint"`, `"generation"`, `"generations"`, `"engine_version"`} {
		if strings.Contains(string(b), absent) {
			t.Errorf("manifest has %s while the store does not know it", absent)
		}
	}
	card, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "README.md.golden", card)
	// Checksums and the time vary with the writer's bytes; the rest is golden.
	m.Files = nil
	mb, _ := json.MarshalIndent(m, "", "  ")
	golden(t, "manifest.json.golden", append(mb, '\n'))
}

func TestPercentiles(t *testing.T) {
	tests := []struct {
		h    map[int]int
		want Percentiles
	}{
		{nil, Percentiles{}},
		{map[int]int{7: 1}, Percentiles{N: 1, Mean: 7, Min: 7, P50: 7, P90: 7, P99: 7, Max: 7}},
		// 1..100 once each: nearest rank.
		{func() map[int]int {
			h := map[int]int{}
			for i := 1; i <= 100; i++ {
				h[i] = 1
			}
			return h
		}(), Percentiles{N: 100, Mean: 50.5, Min: 1, P50: 50, P90: 90, P99: 99, Max: 100}},
		{map[int]int{10: 98, 1000: 2}, Percentiles{N: 100, Mean: 29.8, Min: 10, P50: 10, P90: 10, P99: 1000, Max: 1000}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, percentiles(tt.h)); diff != "" {
			t.Errorf("percentiles(%v) (-want +got):\n%s", tt.h, diff)
		}
	}
}

// TestCardKeepsForeignReadme: a README.md regen did not write is left
// byte for byte, with a warning; regen's own card is rewritten.
func TestCardKeepsForeignReadme(t *testing.T) {
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	mine := []byte("# My dataset\n\nHand-written.\n")
	if err := os.WriteFile(readme, mine, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := ExportWith(context.Background(), fixture(t), dir, Formats, "demo", Options{Describe: describeFixture})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(readme); string(got) != string(mine) {
		t.Errorf("README.md changed:\n%s", got)
	}
	if len(sum.Warnings) != 1 || !strings.Contains(sum.Warnings[0], "README.md was not written by regen") {
		t.Errorf("warnings %q, want one about README.md", sum.Warnings)
	}
	for _, f := range readManifest(t, dir, "demo").Files {
		if f.Path == "README.md" {
			t.Errorf("manifest lists the foreign README.md")
		}
	}

	// regen's own card is replaced at the next export.
	if err := os.Remove(readme); err != nil {
		t.Fatal(err)
	}
	if _, err := ExportWith(context.Background(), fixture(t), dir, Formats, "demo", Options{Describe: describeFixture}); err != nil {
		t.Fatal(err)
	}
	d := describeFixture
	d.RegenVersion = "v9"
	sum, err = ExportWith(context.Background(), fixture(t), dir, Formats, "demo", Options{Describe: d})
	if err != nil || len(sum.Warnings) != 0 {
		t.Fatalf("second export: %v, warnings %q", err, sum.Warnings)
	}
	if got, _ := os.ReadFile(readme); !strings.Contains(string(got), "Built with regen v9.") {
		t.Errorf("regen's card was not rewritten:\n%s", got)
	}
}

// TestManifestNotLeftBehindOnError: a failed export leaves neither a card
// nor a manifest (nor their temporary files).
func TestManifestNotLeftBehindOnError(t *testing.T) {
	dir := t.TempDir()
	fs := fixture(t)
	fs.failAfter = 2
	if _, err := ExportWith(context.Background(), fs, dir, Formats, "demo", Options{Describe: describeFixture}); !errors.Is(err, errFake) {
		t.Fatalf("export = %v, want the store's error", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		t.Errorf("left behind: %s", e.Name())
	}
}
