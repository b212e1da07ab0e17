package capture

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// The server's file of a capture is noted in the key's row as soon as the
// answer names it (Request.Named, NoteCaptureServerPath), before it is
// read or moved. A worker killed (or whose lease lapsed) before it settled
// the file leaves it, and the connector's lock, in the server's folder;
// the key's next holder finds the path in its claim and removes both, so
// such files cannot pile up on the shared storage.

// handedOnWait bounds the wait for a handed-on file's writer to end; past
// it the file is kept (the writer would recreate a removed name), its path
// still noted for the next start. A variable for tests.
var handedOnWait = time.Minute

// clearHandedOn removes the server's file and lock an earlier attempt at
// c's key was handed and did not settle, when removable allows it; with
// other workers (Shared) only once the store confirms this worker still
// holds the key, so a paused holder's file is never taken by a lapsed
// claim. It reports true (nothing more to do) on a lost lease.
func (r *runner) clearHandedOn(ctx context.Context, c store.CaptureClaim, dst string) (bool, error) {
	p := c.ServerPath
	if p == "" {
		return false, nil
	}
	if why := unremovable(p, dst, r.cfg.Dir); why != "" {
		r.cfg.Log.Warn("capture_server_file_kept", "key", c.Key, "path", p, "why", why)
		return false, nil
	}
	if r.cfg.Shared {
		if err := r.st.ConfirmCapture(ctx, c, r.cfg.Lease); err != nil {
			return true, r.lost(c, err)
		}
	}
	// The connector may still be writing the file (it answers first): a
	// name removed before it creates the file would be recreated.
	if err := waitWritten(ctx, p, handedOnWait); ctx.Err() != nil {
		return true, ctx.Err()
	} else if err != nil {
		r.cfg.Log.Warn("capture_server_file_still_locked", "key", c.Key, "path", p, "err", err)
		return false, nil
	}
	n, err := removeServerFiles(Result{Path: p, Leftovers: []string{p + ".lock"}})
	if err != nil {
		return false, fmt.Errorf("capture %s: remove the server's file an earlier attempt left: %w", c.Key, err)
	}
	if n > 0 {
		r.cfg.Log.Info("capture_server_leftover_removed", "key", c.Key, "path", p, "files", n)
		r.count(true, func(s *Summary) { s.ServerLeftovers += n })
	}
	return false, nil
}

// unremovable says why the server's file p, handed to an earlier attempt
// at the key whose file is dst, must not be removed ("" when it may): it
// must be an absolute, clean hidden-state file name, not the key's placed
// file, and outside the folder files are placed in, links followed
// (whatever is there is regen's own: adopt and Sweep settle it). The store
// hands on a path only to the key that noted it, never one another key's
// row names.
func unremovable(p, dst, dir string) string {
	switch {
	case !filepath.IsAbs(p) || filepath.Clean(p) != p:
		return "not an absolute clean path"
	case !strings.HasSuffix(p, Ext):
		return "not a " + Ext + " file"
	case p == filepath.Clean(dst):
		return "the key's placed file"
	}
	rel, err := filepath.Rel(resolved(filepath.Clean(dir)), filepath.Join(resolved(filepath.Dir(p)), filepath.Base(p)))
	if err != nil || (rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))) {
		return "inside the folder captures are placed in"
	}
	return ""
}

// resolved is dir with its symbolic links followed, so an alias of the
// capture folder is recognised; dir itself when it cannot be resolved
// (it does not exist).
func resolved(dir string) string {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return r
	}
	return dir
}

// removeServerFiles removes what a capture left on the server's side: its
// file when it was not placed and the connector's lock file, and reports
// how many it removed (a name already gone counts none).
func removeServerFiles(res Result) (int, error) {
	n := 0
	var errs []error
	for _, p := range append([]string{res.Path}, res.Leftovers...) {
		if p == "" {
			continue
		}
		switch err := os.Remove(p); {
		case err == nil:
			n++
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// dropServerFiles removes a settled capture's server-side files; a
// failure to is logged (the key's record does not depend on it).
func (r *runner) dropServerFiles(res Result) {
	if _, err := removeServerFiles(res); err != nil {
		r.cfg.Log.Warn("capture_server_file_remove_failed", "err", err)
	}
}

// clearLeft removes, at a sole worker's start (every lease released), the
// server files and locks interrupted attempts left, by the same rules as
// clearHandedOn, and forgets each path removed: a key not walked again
// (its sample generated again with fewer turns, or not done now) leaves
// nothing behind either.
func (r *runner) clearLeft(ctx context.Context) error {
	left, err := r.st.LeftServerPaths(ctx)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	for key, p := range left {
		if why := unremovable(p, filepath.Join(r.cfg.Dir, StableName(key)+Ext), r.cfg.Dir); why != "" {
			r.cfg.Log.Warn("capture_server_file_kept", "key", key, "path", p, "why", why)
			continue
		}
		if err := waitWritten(ctx, p, handedOnWait); ctx.Err() != nil {
			return ctx.Err()
		} else if err != nil {
			r.cfg.Log.Warn("capture_server_file_still_locked", "key", key, "path", p, "err", err)
			continue // kept noted: the next start removes it once written
		}
		n, err := removeServerFiles(Result{Path: p, Leftovers: []string{p + ".lock"}})
		if err != nil {
			return fmt.Errorf("capture %s: remove the server's file an earlier attempt left: %w", key, err)
		}
		if err := r.st.ClearServerPath(ctx, key, p); err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		if n > 0 {
			r.cfg.Log.Info("capture_server_leftover_removed", "key", key, "path", p, "files", n)
			r.count(true, func(s *Summary) { s.ServerLeftovers += n })
		}
	}
	return nil
}
