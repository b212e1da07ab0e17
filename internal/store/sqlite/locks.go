package sqlite

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"syscall"
)

// TryLock takes an exclusive flock(2) on a file named after the lock in the
// directory beside the store (<store>.locks). flock belongs to the open
// file, so two holders conflict even inside one process, and the kernel
// drops it when its holder dies.
func (s *Store) TryLock(_ context.Context, name string) (func() error, bool, error) {
	if err := os.MkdirAll(s.lockDir, 0o755); err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	path := filepath.Join(s.lockDir, fmt.Sprintf("%016x.lock", h.Sum64()))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	// The name, for whoever looks into the directory.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(name+"\n"), 0)
	return func() error {
		if err := f.Close(); err != nil { // closing releases the flock
			return fmt.Errorf("unlock %s: %w", name, err)
		}
		return nil
	}, true, nil
}
