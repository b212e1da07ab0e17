package capture

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

// ErrMismatch says the captured files on disk are not what the store
// records; the VerifyReport names each file and what differs.
var ErrMismatch = errors.New("hidden-state files do not verify")

// Listing is what Verify reads: every captured file the store records.
type Listing interface {
	EachCapturedFile(ctx context.Context, fn func(store.CapturedFile) error) error
}

// Problem is one captured file that does not match: its path relative to
// the job file's folder, and what differs.
type Problem struct {
	Path string
	What string
}

func (p Problem) String() string { return p.Path + ": " + p.What }

// VerifyReport is what Verify checked and found.
type VerifyReport struct {
	Files    int   // files the store lists, each checked
	Bytes    int64 // bytes read and hashed
	Problems []Problem
}

// Err is nil when every file matched, else ErrMismatch with the first
// problem and how many more there are.
func (r VerifyReport) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	more := ""
	if n := len(r.Problems) - 1; n > 0 {
		more = fmt.Sprintf(" (and %d more)", n)
	}
	return fmt.Errorf("%w: %s%s", ErrMismatch, r.Problems[0], more)
}

// Verify re-checks every captured file the store lists against its
// record (present, bytes, SHA-256 over every byte), and that dir (the
// capture folder) holds no .safetensors file the store does not list: a
// file moved in but never recorded, or left by a capture that was
// recorded under another name. Paths in the records and the report are
// relative to jobDir. A mismatch is a Problem; the error is for what
// stopped the check (a store failure).
func Verify(ctx context.Context, ls Listing, jobDir, dir string) (VerifyReport, error) {
	var r VerifyReport
	listed := map[string]string{} // absolute path -> key
	buf := make([]byte, 1<<20)
	err := ls.EachCapturedFile(ctx, func(f store.CapturedFile) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.Files++
		path := job.FromRel(jobDir, f.Path)
		if other, dup := listed[path]; dup {
			r.Problems = append(r.Problems, Problem{Path: f.Path, What: fmt.Sprintf("listed for both %s and %s", other, f.Key)})
			return nil
		}
		listed[path] = f.Key
		n, p := checkListed(path, f, buf)
		r.Bytes += n
		if p != "" {
			r.Problems = append(r.Problems, Problem{Path: f.Path, What: p})
		}
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("verify hidden states: %w", err)
	}
	unlisted, err := unlistedFiles(jobDir, dir, listed)
	if err != nil {
		return r, err
	}
	r.Problems = append(r.Problems, unlisted...)
	return r, nil
}

// checkListed compares one file with its record; it returns the bytes it
// read and what differs ("" when nothing does).
func checkListed(path string, f store.CapturedFile, buf []byte) (int64, string) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Sprintf("recorded for %s but missing", f.Key)
	}
	if err != nil {
		return 0, err.Error()
	}
	defer fh.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, fh, buf)
	switch {
	case err != nil:
		return n, fmt.Sprintf("read: %v", err)
	case n != f.Bytes:
		return n, fmt.Sprintf("%d bytes, the store records %d for %s (cut short or grown)", n, f.Bytes, f.Key)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		return n, fmt.Sprintf("SHA-256 %s, the store records %s for %s (the bytes changed since the capture)", sum, f.SHA256, f.Key)
	}
	return n, ""
}

// unlistedFiles names the .safetensors files under dir that no record
// lists. A folder that does not exist holds none.
func unlistedFiles(jobDir, dir string, listed map[string]string) ([]Problem, error) {
	var out []Problem
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path == dir {
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".safetensors") {
			return nil
		}
		if _, ok := listed[job.FromRel(jobDir, path)]; !ok {
			out = append(out, Problem{Path: filepath.ToSlash(job.RelTo(jobDir, path)), What: "in the capture folder but not recorded in the store (a capture killed between placing and recording it leaves one: regen capture adopts or removes it)"})
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("verify hidden states: list %s: %w", dir, err)
	}
	return out, nil
}

// RecheckStore is what Recheck uses of a job's store.
type RecheckStore interface {
	Listing
	RequeueCaptured(ctx context.Context, key, reason string) (bool, error)
	ClaimCapture(ctx context.Context, k store.CaptureKey, owner string, lease time.Duration) (store.CaptureClaim, bool, error)
	ReleaseCapture(ctx context.Context, c store.CaptureClaim) error
}

// Recheck hashes every recorded file as Verify does and returns each key
// whose file is missing or differs from its record to pending, so the
// next capture writes it again; it reports those problems. A changed file
// is renamed aside (Sweep removes it) under a claim of the key, the only
// way a recorded key's file leaves its name: it would otherwise pass the
// next capture's check and be adopted as it is.
func Recheck(ctx context.Context, st RecheckStore, jobDir, owner string) ([]Problem, error) {
	var bad []store.CapturedFile
	var out []Problem
	buf := make([]byte, 1<<20)
	err := st.EachCapturedFile(ctx, func(f store.CapturedFile) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, p := checkListed(job.FromRel(jobDir, f.Path), f, buf); p != "" {
			bad = append(bad, f)
			out = append(out, Problem{Path: f.Path, What: p})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recheck hidden states: %w", err)
	}
	for i, f := range bad {
		if err := requeue(ctx, st, jobDir, owner, f, out[i].What); err != nil {
			return out, err
		}
	}
	return out, nil
}

// requeue returns f's key to pending and moves its file out of the way.
func requeue(ctx context.Context, st RecheckStore, jobDir, owner string, f store.CapturedFile, why string) error {
	if ok, err := st.RequeueCaptured(ctx, f.Key, "recheck: "+why); err != nil || !ok {
		return err // not captured any more: another worker settled it meanwhile
	}
	c, ok, err := st.ClaimCapture(ctx, f.CaptureKey, owner, time.Minute)
	if err != nil || !ok {
		return err // claimed by a capture already running: it checks the file itself
	}
	path := job.FromRel(jobDir, f.Path)
	err = os.Rename(path, partPath(filepath.Dir(path)))
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if rerr := st.ReleaseCapture(ctx, c); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("recheck %s: %w", f.Key, err)
	}
	return nil
}
