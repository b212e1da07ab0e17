package capture

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/store"
)

// verifyFixture writes three checked hidden-state files into jobDir's
// hidden_states folder and returns the records the store would hold.
func verifyFixture(t *testing.T, jobDir string) []store.CapturedFile {
	t.Helper()
	capDir := filepath.Join(jobDir, "hidden_states")
	if err := os.MkdirAll(capDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var recs []store.CapturedFile
	for i, key := range []string{"p/a", "p/b", "p/c"} {
		path := filepath.Join(capDir, strings.ReplaceAll(key, "/", "_")+".safetensors")
		sent := ids(10 + i)
		goodFile(sent, 2, 16).write(t, path)
		info, err := CheckFile(path, sent, Expect{})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, store.CapturedFile{CaptureKey: store.CaptureKey{Key: key, SampleID: key, Turn: store.WholeConversation},
			Path: "hidden_states/" + filepath.Base(path), Bytes: info.Bytes, SHA256: info.SHA256, Tokens: info.Shape.Tokens, Layers: 2, Hidden: 16, DType: "bf16"})
	}
	return recs
}

// TestVerify re-hashes the recorded files: all match, then each kind of
// damage (a file cut, a byte flipped, a file gone, a file no record
// lists, two records naming one file) is named, the first in Err.
func TestVerify(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, jobDir string, recs []store.CapturedFile) []store.CapturedFile
		want   []string
	}{
		{"all match", nil, nil},
		{"cut", func(t *testing.T, jobDir string, recs []store.CapturedFile) []store.CapturedFile {
			p := filepath.Join(jobDir, recs[1].Path)
			st, _ := os.Stat(p)
			noErr(t, os.Truncate(p, st.Size()-7))
			return recs
		}, []string{"hidden_states/p_b.safetensors: ", " bytes, the store records ", " for p/b (cut short or grown)"}},
		{"flipped", func(t *testing.T, jobDir string, recs []store.CapturedFile) []store.CapturedFile {
			p := filepath.Join(jobDir, recs[2].Path)
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 1
			noErr(t, os.WriteFile(p, b, 0o644))
			return recs
		}, []string{"hidden_states/p_c.safetensors: SHA-256 ", "the store records " + "", "for p/c (the bytes changed since the capture)"}},
		{"missing", func(t *testing.T, jobDir string, recs []store.CapturedFile) []store.CapturedFile {
			noErr(t, os.Remove(filepath.Join(jobDir, recs[0].Path)))
			return recs
		}, []string{"hidden_states/p_a.safetensors: recorded for p/a but missing"}},
		{"unlisted", func(t *testing.T, jobDir string, recs []store.CapturedFile) []store.CapturedFile {
			noErr(t, os.WriteFile(filepath.Join(jobDir, "hidden_states", "stray.safetensors"), []byte("x"), 0o644))
			return recs
		}, []string{"hidden_states/stray.safetensors: in the capture folder but not recorded in the store"}},
		{"listed twice", func(t *testing.T, jobDir string, recs []store.CapturedFile) []store.CapturedFile {
			dup := recs[0]
			dup.Key = "p/z"
			return append(recs, dup)
		}, []string{"hidden_states/p_a.safetensors: listed for both p/a and p/z"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			jobDir := t.TempDir()
			recs := verifyFixture(t, jobDir)
			if c.damage != nil {
				recs = c.damage(t, jobDir, recs)
			}
			rep, err := Verify(ctx, filesCaptures{files: recs}, jobDir, filepath.Join(jobDir, "hidden_states"))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Files != len(recs) {
				t.Errorf("checked %d files, want %d", rep.Files, len(recs))
			}
			if c.want == nil {
				if rep.Err() != nil || rep.Bytes == 0 {
					t.Fatalf("Verify: %v (%d bytes hashed), want a match", rep.Err(), rep.Bytes)
				}
				return
			}
			err = rep.Err()
			if !errors.Is(err, ErrMismatch) || len(rep.Problems) != 1 {
				t.Fatalf("Verify: %v with %d problems, want one mismatch", err, len(rep.Problems))
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Verify error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestVerifyNoFolder: a job that captured nothing yet has no folder, and
// that is no mismatch.
func TestVerifyNoFolder(t *testing.T) {
	jobDir := t.TempDir()
	rep, err := Verify(context.Background(), filesCaptures{}, jobDir, filepath.Join(jobDir, "hidden_states"))
	if err != nil || rep.Err() != nil || rep.Files != 0 {
		t.Fatalf("Verify of no folder: %v, %v, %d files", err, rep.Err(), rep.Files)
	}
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestVerifyOutsideJobFolder: a capture folder outside the job file's
// folder is recorded with absolute paths (job.RelTo); its files match and
// a stray file there is named, by its absolute path.
func TestVerifyOutsideJobFolder(t *testing.T) {
	jobDir, elsewhere := t.TempDir(), t.TempDir()
	recs := verifyFixture(t, elsewhere)
	for i := range recs {
		recs[i].Path = filepath.Join(elsewhere, recs[i].Path)
	}
	capDir := filepath.Join(elsewhere, "hidden_states")
	rep, err := Verify(context.Background(), filesCaptures{files: recs}, jobDir, capDir)
	if err != nil || rep.Err() != nil || rep.Files != 3 {
		t.Fatalf("Verify of files recorded absolute: %v, %v, %d files", err, rep.Err(), rep.Files)
	}
	stray := filepath.Join(capDir, "stray.safetensors")
	noErr(t, os.WriteFile(stray, []byte("x"), 0o644))
	rep, err = Verify(context.Background(), filesCaptures{files: recs}, jobDir, capDir)
	if err != nil || len(rep.Problems) != 1 || rep.Problems[0].Path != filepath.ToSlash(stray) {
		t.Fatalf("Verify with a stray file: %v, %+v; want it named by its absolute path", err, rep.Problems)
	}
}
