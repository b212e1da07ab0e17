package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// capturedFixture writes two hidden-state stand-in files into a capture
// folder beside (not inside) the export folder and returns their records,
// paths relative to jobDir as the store keeps them: the turn rows of
// tokenFixture's P1/t1 and P1/t2, with the hashes of their ids.
func capturedFixture(t *testing.T, jobDir string) (*CapturedFiles, []store.CapturedFile) {
	t.Helper()
	return capturedOf(t, jobDir, []store.CaptureKey{
		{Key: "P1/t1/turn1", SampleID: "P1/t1", Turn: 0, Input: tokenrows.InputHash(ids(5, 6, 7))},
		{Key: "P1/t2/turn1", SampleID: "P1/t2", Turn: 0, Input: tokenrows.InputHash(ids(5, 8, 9, 10))}})
}

// capturedOf writes a stand-in file for each key and lists their records.
func capturedOf(t *testing.T, jobDir string, keys []store.CaptureKey) (*CapturedFiles, []store.CapturedFile) {
	t.Helper()
	capDir := filepath.Join(jobDir, "hidden_states")
	if err := os.MkdirAll(capDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var recs []store.CapturedFile
	for i, k := range keys {
		body := []byte(strings.Repeat(string(rune('a'+i)), 1000+i))
		name := filepath.Join(capDir, strings.ReplaceAll(k.Key, "/", "_")+".safetensors")
		if err := os.WriteFile(name, body, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		recs = append(recs, store.CapturedFile{CaptureKey: k, Path: "hidden_states/" + filepath.Base(name), Bytes: int64(len(body)),
			SHA256: hex.EncodeToString(sum[:]), Tokens: 15 + i, Layers: 3, Hidden: 8, DType: "bf16"})
	}
	return &CapturedFiles{Dir: capDir, Each: func(_ context.Context, fn func(store.CapturedFile) error) error {
		for _, r := range recs {
			if err := fn(r); err != nil {
				return err
			}
		}
		return nil
	}}, recs
}

// TestExportListsHiddenStates: with captured files the manifest lists each
// (path relative to the manifest, key, bytes, sha256, shape, dtype), the
// card has a hidden-states section, the sha256sum file checks them with
// sha256sum -c run in the export folder, and Verify passes; a changed
// file then fails sha256sum -c.
func TestExportListsHiddenStates(t *testing.T) {
	jobDir := t.TempDir()
	dir := filepath.Join(jobDir, "out")
	captured, recs := capturedFixture(t, jobDir)
	ctx := context.Background()
	o := Options{JobDir: jobDir, Captured: captured, TokenIDs: true, TokenRows: TokenRowsTurn}
	if _, err := ExportWith(ctx, tokenFixture(t), dir, Formats, "job", o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(ManifestPath(dir, "job"))
	if err != nil {
		t.Fatal(err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	h := m.HiddenStates
	if h == nil || h.Count != 2 || h.Bytes != 2001 || h.Tokens != 31 || h.Layers != 3 || h.Hidden != 8 || h.DType != "bf16" ||
		h.Dir != "../hidden_states" || h.SumsFile != "job.hidden_states.sha256" || len(h.Files) != 2 {
		t.Fatalf("manifest hidden_states = %+v", h)
	}
	f := h.Files[1]
	if f.Key != "P1/t2/turn1" || f.SampleID != "P1/t2" || f.Turn == nil || *f.Turn != 1 || f.Path != "../hidden_states/P1_t2_turn1.safetensors" ||
		f.Bytes != 1001 || f.SHA256 != recs[1].SHA256 || f.Shape != [3]int{16, 3, 8} || f.DType != "bf16" || h.Files[0].Turn == nil {
		t.Errorf("manifest file = %+v", f)
	}
	card, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Hidden states", "2 files of the target model's hidden states in `../hidden_states/` (31 tokens, 2001 bytes in all)",
		"`hidden_states` (bf16, [tokens, 3 layers, 8 hidden])", `load_file("../hidden_states/P1_t1_turn1.safetensors")`, "sha256sum -c job.hidden_states.sha256"} {
		if !strings.Contains(string(card), want) {
			t.Errorf("card lacks %q", want)
		}
	}
	rep, err := Verify(ctx, tokenFixture(t), dir, "job", o)
	if err != nil || rep.Err() != nil {
		t.Fatalf("Verify: %v, %v", err, rep.Err())
	}
	// A capture recorded after the export (the manifest written without
	// P1/t2's file): the manifest is stale.
	m.HiddenStates.Files = m.HiddenStates.Files[:1]
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ManifestPath(dir, "job"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	more := slices.Clone(recs)
	more[1].CapturedAt = time.Now().Add(time.Hour)
	stale := o
	stale.Captured = &CapturedFiles{Dir: captured.Dir, Each: func(_ context.Context, fn func(store.CapturedFile) error) error {
		for _, r := range more {
			if err := fn(r); err != nil {
				return err
			}
		}
		return nil
	}}
	rep, err = Verify(ctx, tokenFixture(t), dir, "job", stale)
	if err != nil || rep.Err() == nil || !strings.Contains(rep.Err().Error(), "job.manifest.json: does not list the hidden states of P1/t2/turn1 (../hidden_states/P1_t2_turn1.safetensors) the store records") {
		t.Fatalf("Verify with a capture recorded after the export: %v, %v", err, rep.Err())
	}
	// The check at the end of an export passes over what was captured
	// after the export began (another worker still capturing).
	rep, err = verify(ctx, tokenFixture(t), dir, "job", stale, time.Now())
	if err != nil || rep.Err() != nil {
		t.Fatalf("verify since the export began, a file captured after it: %v, %v; want it passed over", err, rep.Err())
	}
	sumCheck := exec.Command("sha256sum", "-c", "job.hidden_states.sha256")
	sumCheck.Dir = dir
	if out, err := sumCheck.CombinedOutput(); err != nil || strings.Count(string(out), ": OK") != 2 {
		t.Fatalf("sha256sum -c in the export folder: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(captured.Dir, "P1_t1_turn1.safetensors"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	sumCheck = exec.Command("sha256sum", "-c", "job.hidden_states.sha256")
	sumCheck.Dir = dir
	if out, err := sumCheck.CombinedOutput(); err == nil || !strings.Contains(string(out), "P1_t1_turn1.safetensors: FAILED") {
		t.Fatalf("sha256sum -c after a file changed: %v\n%s, want it to fail naming the file", err, out)
	}
}

// TestExportLeavesOutStaleCaptures: a captured file is listed only for a
// written row whose input_ids it holds. A row regenerated since its
// capture (other ids), a key no row has any more, a row whose ids are
// unavailable, and a conversation's key
// after output.token_rows switched to turns are left out of the manifest,
// the card's count and the sha256sum file, counted stale, and Verify
// names them without failing; a manifest that lists one fails.
func TestExportLeavesOutStaleCaptures(t *testing.T) {
	jobDir := t.TempDir()
	dir := filepath.Join(jobDir, "out")
	ctx := context.Background()
	captured, _ := capturedOf(t, jobDir, []store.CaptureKey{
		{Key: "P1/t1/turn1", SampleID: "P1/t1", Turn: 0, Input: tokenrows.InputHash(ids(5, 6, 7))},
		{Key: "P1/t2/turn1", SampleID: "P1/t2", Turn: 0, Input: tokenrows.InputHash(ids(5, 8, 9, 11))},
		{Key: "P1/gone/turn1", SampleID: "P1/gone", Turn: 0, Input: tokenrows.InputHash(ids(5, 6, 7))},
		{Key: "P1/a1/turn1", SampleID: "P1/a1", Turn: 0, Input: tokenrows.InputHash(ids(5, 6, 7))},
		{Key: "P1/t1", SampleID: "P1/t1", Turn: store.WholeConversation, Input: tokenrows.InputHash(ids(5, 6, 7))}})
	o := Options{JobDir: jobDir, Captured: captured, TokenIDs: true, TokenRows: TokenRowsTurn}
	if _, err := ExportWith(ctx, tokenFixture(t), dir, Formats, "job", o); err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, dir, "job")
	h := m.HiddenStates
	if h == nil || h.Count != 1 || h.Stale != 4 || len(h.Files) != 1 || h.Files[0].Key != "P1/t1/turn1" {
		t.Fatalf("manifest hidden_states = %+v; want only P1/t1/turn1 listed, 4 stale", h)
	}
	sums, err := os.ReadFile(HiddenSumsPath(dir, "job"))
	if err != nil || strings.Count(string(sums), "\n") != 1 || !strings.Contains(string(sums), "P1_t1_turn1.safetensors") {
		t.Errorf("sha256sum file %q (%v), want the one current file", sums, err)
	}
	card, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	for _, want := range []string{"1 files of the target model's hidden states", "4 more captured files in that folder are not listed"} {
		if !strings.Contains(string(card), want) {
			t.Errorf("card lacks %q", want)
		}
	}
	rep, err := Verify(ctx, tokenFixture(t), dir, "job", o)
	if err != nil || rep.Err() != nil {
		t.Fatalf("Verify: %v, %v", err, rep.Err())
	}
	if want := []string{"P1/t2/turn1", "P1/gone/turn1", "P1/a1/turn1", "P1/t1"}; !slices.Equal(rep.StaleCaptures, want) {
		t.Errorf("Verify's stale captures %v, want %v", rep.StaleCaptures, want)
	}
	// At the end of an export of a running job, a row generated again
	// after the export began is passed over, its listed capture with it.
	moved := tokenFixture(t)
	for i, r := range moved.rows {
		if r.ID == "P1/t1" {
			moved.rows[i] = doneRow(t, "P1/t1", `{"messages":[{"role":"user","content":"d"}]}`, answer(ids(5, 6), ids(8)))
			moved.rows[i].FinishedAt = time.Now().Add(time.Hour)
		}
	}
	if rep, err := verify(ctx, moved, dir, "job", o, time.Now()); err != nil || rep.Err() != nil {
		t.Fatalf("verify since the export began, P1/t1 generated again meanwhile: %v, %v; want it passed over", err, rep.Err())
	}
	// A manifest that lists a stale capture fails.
	m.HiddenStates.Files = append(m.HiddenStates.Files, HiddenStateFile{Key: "P1/t2/turn1", Path: "../hidden_states/P1_t2_turn1.safetensors"})
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ManifestPath(dir, "job"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err = Verify(ctx, tokenFixture(t), dir, "job", o)
	if err != nil || rep.Err() == nil || !strings.Contains(rep.Err().Error(), "lists hidden states of P1/t2/turn1 (../hidden_states/P1_t2_turn1.safetensors) whose token_ids are not the exported row's input_ids") {
		t.Fatalf("Verify of a manifest listing a stale capture: %v, %v", err, rep.Err())
	}
	// Conversation rows: now P1/t1's conversation file is the current one.
	o.TokenRows = TokenRowsConversation
	if _, err := ExportWith(ctx, tokenFixture(t), dir, Formats, "job", o); err != nil {
		t.Fatal(err)
	}
	if h := readManifest(t, dir, "job").HiddenStates; h.Count != 1 || h.Stale != 4 || h.Files[0].Key != "P1/t1" {
		t.Fatalf("conversation rows: hidden_states = %+v; want only P1/t1 listed", h)
	}
}
