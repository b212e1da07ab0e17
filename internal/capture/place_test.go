package capture

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/regen-dev/regen/internal/testfs"
)

// TestStableName: any id gives a file name of safe bytes that is not
// hidden, is the same every time, and differs from every other id's,
// also between ids that read the same once sanitised.
func TestStableName(t *testing.T) {
	safe := regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*-[0-9a-f]{16}$`)
	keys := []string{"p/a", "p_a", "p a", "../../etc/passwd", ".hidden", "", "p/a/turn2", "ü/日本", strings.Repeat("x", 500),
		strings.Repeat("x", 500) + "y", "a\x00b", "a\nb", "CON", "p/a#0"}
	seen := map[string]string{}
	for _, k := range keys {
		n := StableName(k)
		if !safe.MatchString(n) || len(n) > 100 || n != StableName(k) {
			t.Errorf("StableName(%q) = %q: want safe, short and stable", k, n)
		}
		if other, dup := seen[n]; dup {
			t.Errorf("StableName(%q) = StableName(%q) = %q", k, other, n)
		}
		seen[n] = k
	}
}

// TestPlaceNeverReplaces: moving onto an existing name fails with
// ErrExists and leaves both files as they were.
func TestPlaceNeverReplaces(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	must(t, os.WriteFile(src, []byte("new"), 0o644))
	must(t, os.WriteFile(dst, []byte("old"), 0o644))
	if err := move(src, dst); !errors.Is(err, ErrExists) {
		t.Fatalf("Place onto an existing file: %v, want ErrExists", err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "old" {
		t.Errorf("dst now holds %q", b)
	}
	if b, _ := os.ReadFile(src); string(b) != "new" {
		t.Errorf("src now holds %q", b)
	}
	must(t, os.Remove(dst))
	must(t, move(src, dst))
	if b, _ := os.ReadFile(dst); string(b) != "new" {
		t.Errorf("placed file holds %q", b)
	}
	if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("src still there after Place: %v", err)
	}
}

// TestPlaceAcrossFileSystems: a server folder on another file system (a
// tmpfs of its own; a rename between the two fails with EXDEV, checked
// first) is copied through a temporary file and renamed; no temporary file
// is left, and the source is removed.
func TestPlaceAcrossFileSystems(t *testing.T) {
	server := testfs.Tmpfs(t, 1<<20)
	dir := t.TempDir()
	probe := filepath.Join(server, "probe")
	must(t, os.WriteFile(probe, nil, 0o644))
	if err := renameNoReplace(probe, filepath.Join(dir, "probe")); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename from the tmpfs into %s: %v, want EXDEV (two file systems)", dir, err)
	}
	must(t, os.Remove(probe))
	src, dst := filepath.Join(server, "cmpl-1-0.safetensors"), filepath.Join(dir, "a.safetensors")
	must(t, os.WriteFile(src, []byte("hidden states"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "b.safetensors"), []byte("other"), 0o644))
	must(t, move(src, dst))
	if b, _ := os.ReadFile(dst); string(b) != "hidden states" {
		t.Errorf("placed file holds %q", b)
	}
	if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("src still there: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("folder holds %d entries, want the 2 files", len(entries))
	}
	must(t, os.WriteFile(src, []byte("again"), 0o644))
	if err := move(src, dst); !errors.Is(err, ErrExists) {
		t.Errorf("second move across file systems: %v, want ErrExists", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("a refused copy left a temporary file: %d entries", len(entries))
	}
	if n, err := Sweep(dir, 0); err != nil || n != 0 {
		t.Errorf("Sweep = %d, %v; want nothing to sweep", n, err)
	}
}

// TestDirSyncShared: callers at once share fsyncs, and every caller
// returns only after a sync that began after it called (a rename before
// the call is covered); callers one after another each get their own. In
// a synctest bubble the 32 callers all wait while the first sync runs, so
// exactly two syncs serve them: the first caller's and one for the rest.
func TestDirSyncShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDirSync(t.TempDir())
		var mu sync.Mutex
		var starts []time.Time
		d.sync = func(string) error {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // the bubble's clock: no wall-clock wait
			return nil
		}
		const callers = 32
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				called := time.Now()
				if err := d.Sync(); err != nil {
					t.Error(err)
				}
				mu.Lock()
				defer mu.Unlock()
				if !slices.ContainsFunc(starts, func(s time.Time) bool { return !s.Before(called) }) {
					t.Error("Sync returned before any sync that began after the call")
				}
			})
		}
		wg.Wait()
		if n := len(starts); n != 2 {
			t.Errorf("%d fsyncs for %d callers at once, want 2 (the first caller's, then one shared by the rest)", n, callers)
		}
		before := len(starts)
		for range 3 {
			must(t, d.Sync())
		}
		if got := len(starts) - before; got != 3 {
			t.Errorf("3 calls one after another made %d fsyncs, want 3", got)
		}
	})
}
