package testfs

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// Tmpfs mounts a tmpfs of size bytes on a fresh folder, unmounted at
// cleanup. Mounting needs root (CAP_SYS_ADMIN): CI runs as root, so there
// a failure fails the test; elsewhere it skips loudly.
func Tmpfs(t testing.TB, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		msg := fmt.Sprintf("mount a %d-byte tmpfs on %s: %v: this test needs root", size, dir, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED LOUDLY: " + msg)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
