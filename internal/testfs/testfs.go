// Package testfs tells tests what the file system they run on allows, so
// that a permission test checks what it can here instead of failing or
// skipping, and mounts a small file system of their own (Tmpfs). It is
// imported by tests only.
package testfs

import (
	"os"
	"path/filepath"
	"testing"
)

// WritesReadOnlyDir reports whether this process writes into a 0555 folder
// anyway (root does: chmod does not stop it). It asks the file system
// rather than the user id: a root without CAP_DAC_OVERRIDE is stopped.
func WritesReadOnlyDir(t testing.TB) bool {
	t.Helper()
	d := filepath.Join(t.TempDir(), "probe")
	if err := os.Mkdir(d, 0o555); err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(d, "x")
	if err != nil {
		return false
	}
	f.Close()
	return true
}
