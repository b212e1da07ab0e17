package capture

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Ext is the extension of every captured file.
const Ext = ".safetensors"

// partPrefix names the temporary copies move makes in the folder when it
// moves a file across file systems; Sweep removes those a kill left.
const partPrefix = ".capture-"

// ErrExists is returned by move when the destination already exists: a
// file placed for the key before (by a run killed before it recorded it,
// or by a worker that lost its lease). move never replaces it.
var ErrExists = errors.New("a file of this name is already in place")

// StableName is the file name (without Ext) of a key's capture: the key
// with every byte outside [A-Za-z0-9._-] as '_', cut to 80 bytes and not
// starting with '.', then '-' and 16 hex digits of the key's sha256, so any
// id (with '/', '..', spaces, any length) gives a name of its own, the same
// in every run.
func StableName(key string) string {
	var b strings.Builder
	for i := 0; i < len(key) && b.Len() < 80; i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		case c == '.' && b.Len() > 0:
			b.WriteByte(c)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteByte('_')
	}
	sum := sha256.Sum256([]byte(key))
	return b.String() + "-" + hex.EncodeToString(sum[:8])
}

// move moves the checked file src to dst, durably and atomically: the
// data is synced, dst appears whole or not at all and never replaces a
// file already there (ErrExists). Across file systems src is copied to a
// temporary file beside dst, synced, and renamed the same way; src is
// removed. The caller syncs dst's folder (dirSync) before it records dst.
func move(src, dst string) error {
	if err := syncFile(src); err != nil {
		return fmt.Errorf("place %s: %w", src, err)
	}
	err := renameNoReplace(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		err = copyThenRename(src, dst)
	}
	return err
}

// dirSync fsyncs one folder for many placements at once: a caller waits
// for a sync that started after its rename, and starts one when none is
// running, so concurrent workers share each fsync (group commit of
// directory entries).
type dirSync struct {
	dir     string
	sync    func(dir string) error // syncDir; tests count the calls (dirSyncer)
	mu      sync.Mutex
	cond    *sync.Cond
	started uint64 // syncs begun
	done    uint64 // the latest sync ended
	running bool
	err     error // of the latest sync
}

func newDirSync(dir string) *dirSync {
	d := &dirSync{dir: dir, sync: dirSyncer}
	d.cond = sync.NewCond(&d.mu)
	return d
}

// Sync returns once a sync of the folder begun after the call has ended.
func (d *dirSync) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	target := d.started + 1 // a running sync may have begun before the caller's rename
	for d.done < target {
		if d.running {
			d.cond.Wait()
			continue
		}
		d.running = true
		d.started++
		n := d.started
		d.mu.Unlock()
		err := d.sync(d.dir)
		d.mu.Lock()
		d.running, d.done, d.err = false, n, err
		d.cond.Broadcast()
	}
	if d.err != nil {
		return fmt.Errorf("sync %s: %w", d.dir, d.err)
	}
	return nil
}

// renameNoReplace renames src to dst unless dst exists. A file system
// without RENAME_NOREPLACE gets a hard link and an unlink, which no more
// replaces dst than the rename does.
func renameNoReplace(src, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSYS) {
		err = os.Link(src, dst)
		if err == nil {
			return os.Remove(src)
		}
		var le *os.LinkError
		if errors.As(err, &le) {
			err = le.Err
		}
	}
	switch {
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("place %s: %w", dst, ErrExists)
	case errors.Is(err, syscall.EXDEV):
		return err
	case err != nil:
		return fmt.Errorf("place %s as %s: %w", src, dst, err)
	}
	return nil
}

// copyThenRename copies src into a synced temporary file beside dst and
// renames it into place, then removes src.
func copyThenRename(src, dst string) error {
	tmp := partPath(filepath.Dir(dst))
	if err := copyFile(src, tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("place %s: copy across file systems: %w", dst, err)
	}
	if err := renameNoReplace(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Remove(src); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("place %s: remove the server's copy: %w", dst, err)
	}
	return nil
}

// partPath is a new temporary name in dir, of those Sweep removes.
func partPath(dir string) string {
	var rnd [6]byte
	rand.Read(rnd[:])
	return filepath.Join(dir, partPrefix+hex.EncodeToString(rnd[:])+".part")
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// dirSyncer is how a runner's dirSync syncs its folder; a test counts.
var dirSyncer = syncDir

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Sweep removes the temporary copies in dir that a killed run left,
// those older than olderThan (0: all of them, when no other worker can
// be copying), and reports how many.
func Sweep(dir string, olderThan time.Duration) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", dir, err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), partPrefix) || !strings.HasSuffix(e.Name(), ".part") {
			continue
		}
		if olderThan > 0 {
			info, err := e.Info()
			if err != nil || time.Since(info.ModTime()) < olderThan {
				continue
			}
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("sweep %s: %w", dir, err)
		}
		n++
	}
	return n, nil
}
