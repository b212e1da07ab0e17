package export

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// atomicFile is a file written under a temporary name in its final
// directory and renamed into place by commit; abort leaves nothing behind.
type atomicFile struct {
	final string
	f     *os.File
	w     *bufio.Writer
	dst   io.Writer // w, or a checker comparing with final (Verify)
	sum   hash.Hash // SHA-256 of every byte written, for the manifest
	size  int64
}

// createFunc makes the atomic file of a final path: createAtomic when
// exporting, a checker when verifying.
type createFunc func(final string) (*atomicFile, error)

func createAtomic(final string) (*atomicFile, error) {
	dir, base := filepath.Split(final)
	removeStale(dir, base)
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.tmp-%d", base, os.Getpid()))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	w := bufio.NewWriterSize(f, 256<<10)
	return &atomicFile{final: final, f: f, w: w, dst: w, sum: sha256.New()}, nil
}

func (a *atomicFile) Write(p []byte) (int, error) {
	a.sum.Write(p) // never fails
	a.size += int64(len(p))
	return a.dst.Write(p)
}

// sha256 is the hex SHA-256 of what was written.
func (a *atomicFile) sha256() string { return hex.EncodeToString(a.sum.Sum(nil)) }

// sync makes the temporary file durable; after it, rename is the only step left.
func (a *atomicFile) sync() error {
	if err := a.w.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", a.f.Name(), err)
	}
	if err := a.f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", a.f.Name(), err)
	}
	if err := a.f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", a.f.Name(), err)
	}
	return nil
}

func (a *atomicFile) rename() error {
	if err := os.Rename(a.f.Name(), a.final); err != nil {
		return fmt.Errorf("rename %s: %w", a.final, err)
	}
	return nil
}

// abort closes and removes the temporary file; safe after sync.
func (a *atomicFile) abort() {
	_ = a.f.Close() // the file is being discarded; its close error does not matter
	_ = os.Remove(a.f.Name())
}

// syncDir makes renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// removeStale deletes temporary files of base left by an export whose
// process is gone (killed mid-export); a live exporter's file is kept.
func removeStale(dir, base string) {
	prefix := "." + base + ".tmp-"
	matches, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	for _, m := range matches {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), prefix))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // that exporter is still running
		}
		_ = os.Remove(m) // best effort: a leftover only wastes space
	}
}
