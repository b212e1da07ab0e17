package export

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CheckDir reports whether an export could write its files into dir, the
// way it will: by creating a file there (then removing it). A missing dir
// is fine when its nearest existing parent is a folder that can be written
// (the export creates dir). Nothing else is left behind, so a run and
// validate can check it before any request instead of after all of them.
// A problem is an *fs.PathError naming the path at fault.
func CheckDir(dir string) error {
	at := dir
	for {
		info, err := os.Stat(at)
		if err == nil {
			if !info.IsDir() {
				return &fs.PathError{Op: "write into", Path: at, Err: syscall.ENOTDIR}
			}
			break
		}
		// A parent that is a file answers ENOTDIR: walk up to name it.
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return err
		}
		parent := filepath.Dir(at)
		if parent == at {
			return err
		}
		at = parent
	}
	f, err := os.CreateTemp(at, ".regen-write-check-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the folder is at fault, not the random name
		}
		return &fs.PathError{Op: "create a file in", Path: at, Err: err}
	}
	name := f.Name()
	if err := f.Close(); err != nil {
		return err
	}
	return os.Remove(name)
}
