package export

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/regen-dev/regen/internal/testfs"
)

// TestCheckDir: a writable folder (or a missing one under a writable
// parent) passes and is left as it was; a read-only folder, or a path
// under a regular file, fails with the path at fault.
func TestCheckDir(t *testing.T) {
	base := t.TempDir()
	if err := os.WriteFile(filepath.Join(base, "blocker"), []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{base, filepath.Join(base, "new", "out")} {
		if err := CheckDir(dir); err != nil {
			t.Errorf("CheckDir(%s) = %v, want nil", dir, err)
		}
	}
	if ents, _ := os.ReadDir(base); len(ents) != 1 {
		t.Errorf("CheckDir left %d entries in %s, want only the blocker file", len(ents), base)
	}
	// check wants err at the path "at" (or, for a file CheckDir tried to
	// create, a path in the folder "at").
	check := func(dir, at string, wantErr error) {
		t.Helper()
		err := CheckDir(dir)
		var pe *fs.PathError
		if !errors.As(err, &pe) || !errors.Is(err, wantErr) || (pe.Path != at && filepath.Dir(pe.Path) != at) {
			t.Errorf("CheckDir(%s) = %v, want a %v error at %s", dir, err, wantErr, at)
		}
	}
	check(filepath.Join(base, "blocker", "out"), filepath.Join(base, "blocker"), syscall.ENOTDIR)
	check(filepath.Join(base, "blocker"), filepath.Join(base, "blocker"), syscall.ENOTDIR)
	ro := filepath.Join(base, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if testfs.WritesReadOnlyDir(t) {
		t.Logf("running as root: a 0555 folder is writable here, so only the file-as-parent cases above can fail")
		if err := CheckDir(ro); err != nil {
			t.Errorf("CheckDir(%s) as root = %v, want nil (root writes there)", ro, err)
		}
		return
	}
	check(ro, ro, fs.ErrPermission)
	check(filepath.Join(ro, "out"), ro, fs.ErrPermission)
}
