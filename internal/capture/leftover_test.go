package capture

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/testfs"
)

// TestUnremovable: a handed-on server path is removed only when it is an
// absolute clean .safetensors name outside the capture folder and not the
// key's own placed file.
func TestUnremovable(t *testing.T) {
	dir := "/data/job/hidden_states"
	dst := filepath.Join(dir, StableName("k")+Ext)
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/srv/out/cmpl-1-0.safetensors", true},
		{"/data/job/hidden_states2/cmpl-1-0.safetensors", true}, // a sibling sharing the prefix is outside
		{"srv/out/cmpl-1-0.safetensors", false},                 // relative
		{"/srv/out/../out/cmpl-1-0.safetensors", false},         // not clean
		{"/srv/out/cmpl-1-0.safetensors.lock", false},
		{"/etc/passwd", false},
		{dst, false},
		{filepath.Join(dir, StableName("other")+Ext), false}, // another key's placed file
		{filepath.Join(dir, "sub", "x.safetensors"), false},
		{dir + Ext, true},                           // beside the folder, not in it
		{filepath.Join(dir, "..x"+Ext), false},      // a name starting with two dots is inside
		{filepath.Join(dir, "..", "..x"+Ext), true}, // the same name beside the folder
	} {
		why := unremovable(tc.path, dst, dir)
		if (why == "") != tc.ok {
			t.Errorf("unremovable(%q) = %q, want removable=%v", tc.path, why, tc.ok)
		}
	}
}

// serverFile writes a server's file and its lock as the connector leaves
// them and returns the file's path.
func serverFile(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name+Ext)
	must(t, os.WriteFile(p, []byte("hidden states"), 0o644))
	must(t, os.WriteFile(p+".lock", nil, 0o644))
	return p
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// noteLapsed claims k under a lease that already ended (a killed worker)
// and notes path as the server's file it was handed.
func noteLapsed(t *testing.T, st Store, k store.CaptureKey, path string) {
	t.Helper()
	c, ok, err := st.ClaimCapture(context.Background(), k, "killed", -time.Second)
	if err != nil || !ok {
		t.Fatalf("claim %s: %v %v", k.Key, ok, err)
	}
	must(t, st.NoteCaptureServerPath(context.Background(), c, path))
}

// TestRunRemovesHandedOnServerFiles: a sole worker's run removes at its
// start the server's files and locks killed workers were handed, of keys
// it captures and of a key no done row has now; a path two keys' rows
// name is left alone; and after a finished capture the server's own
// folder holds nothing (each placed file's lock removed).
func TestRunRemovesHandedOnServerFiles(t *testing.T) {
	t.Parallel()
	url, simDir := capSim(t, "", 0, nil)
	st := doneStore(t, 3) // turn rows: s000's two, s001's, s002's
	leftDir := t.TempDir()
	mine := serverFile(t, leftDir, "cmpl-killed-0")
	shared := serverFile(t, leftDir, "cmpl-shared-0")
	noteLapsed(t, st, store.CaptureKey{Key: "p/s001/turn1", SampleID: "p/s001", Turn: 0}, mine)
	noteLapsed(t, st, store.CaptureKey{Key: "p/s002/turn1", SampleID: "p/s002", Turn: 0}, shared)
	noteLapsed(t, st, store.CaptureKey{Key: "other", SampleID: "other", Turn: 0}, shared)
	gone := serverFile(t, leftDir, "cmpl-gone-0") // a key no done row has now
	noteLapsed(t, st, store.CaptureKey{Key: "p/s009/turn1", SampleID: "p/s009", Turn: 0}, gone)

	cfg := testConfig(t, url)
	cfg.PerTurn = true
	sum, err := Run(context.Background(), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Captured != 4 || sum.ServerLeftovers != 4 {
		t.Errorf("summary %+v; want 4 captured and 4 server leftovers (two files and their locks) removed", sum)
	}
	if exists(t, mine) || exists(t, mine+".lock") || exists(t, gone) || exists(t, gone+".lock") {
		t.Error("a killed worker's server file or lock is still there")
	}
	// p/s002's record forgot its path: "other" alone names it now, for the
	// next start to remove; nothing else is still noted.
	if left, err := st.LeftServerPaths(context.Background()); err != nil || len(left) != 1 || left["other"] != shared {
		t.Errorf("server paths still noted after the run: %v, %v; want other's alone", left, err)
	}
	if !exists(t, shared) || !exists(t, shared+".lock") {
		t.Error("a server file two keys' rows name was removed")
	}
	if len(listed(t, st, cfg)) != 4 {
		t.Error("want 4 files recorded")
	}
	left, err := os.ReadDir(simDir)
	must(t, err)
	if len(left) != 0 {
		t.Errorf("the server's folder holds %d entries after the capture (first %s), want none", len(left), left[0].Name())
	}
}

// TestClearHandedOnFenced: with other workers (Shared) a handed-on file is
// removed only under a lease the store confirms; a claim another worker
// took over since removes nothing and counts a lost lease.
func TestClearHandedOnFenced(t *testing.T) {
	r, st := adoptRunner(t)
	r.cfg.Shared = true
	ctx := context.Background()
	k := store.CaptureKey{Key: "s1", SampleID: "s1", Turn: store.WholeConversation, Input: "in"}
	dst := filepath.Join(r.cfg.Dir, StableName(k.Key)+Ext)
	p := serverFile(t, t.TempDir(), "cmpl-1-0")
	noteLapsed(t, st, k, p)
	stale, ok, err := st.ClaimCapture(ctx, k, "cap", -time.Second) // this worker's claim, lapsed at once
	if err != nil || !ok || stale.ServerPath != p {
		t.Fatalf("claim: %+v %v %v; want the noted path handed on", stale, ok, err)
	}
	if _, ok, err := st.ClaimCapture(ctx, k, "thief", time.Minute); err != nil || !ok {
		t.Fatalf("thief's claim: %v %v", ok, err)
	}
	stop, err := r.clearHandedOn(ctx, stale, dst)
	if !stop || err != nil || !exists(t, p) || !exists(t, p+".lock") || r.sum.LeasesLost != 1 {
		t.Fatalf("clearHandedOn under a lost lease = %v, %v, lost %d; want stop, the files kept", stop, err, r.sum.LeasesLost)
	}
	if _, err := st.ReleaseCaptures(ctx, "thief"); err != nil {
		t.Fatal(err)
	}
	c, ok, err := st.ClaimCapture(ctx, k, "cap", time.Minute)
	if err != nil || !ok || c.ServerPath != p {
		t.Fatalf("claim: %+v %v %v", c, ok, err)
	}
	stop, err = r.clearHandedOn(ctx, c, dst)
	if stop || err != nil || exists(t, p) || exists(t, p+".lock") || r.sum.ServerLeftovers != 2 {
		t.Fatalf("clearHandedOn under a held lease = %v, %v, removed %d; want both files removed", stop, err, r.sum.ServerLeftovers)
	}
}

// TestRunAcrossFileSystemsLeavesServerFolderEmpty: with the server's
// folder on another file system every file is copied, and the server's
// copy and its lock are both removed.
func TestRunAcrossFileSystemsLeavesServerFolderEmpty(t *testing.T) {
	server := testfs.Tmpfs(t, 4<<20)
	url, simDir := capSim(t, "", 0, func(c *sim.Config) { c.HiddenStates = server })
	st := doneStore(t, 3)
	cfg := testConfig(t, url)
	cfg.PerTurn = true
	sum, err := Run(context.Background(), st, cfg)
	if err != nil || sum.Captured != 4 {
		t.Fatalf("Run = %+v, %v; want 4 captured", sum, err)
	}
	left, err := os.ReadDir(simDir)
	must(t, err)
	if len(left) != 0 {
		t.Errorf("the server's folder holds %d entries after copies across file systems (first %s), want none", len(left), left[0].Name())
	}
}

// TestRunNoteUnderLostLease: a worker that cannot note the server's file
// (its lease was taken meanwhile) places nothing, removes the file and its
// lock once written, and counts a lost lease; the key is captured once the
// other holder's lease ends, and the server's folder ends empty.
func TestRunNoteUnderLostLease(t *testing.T) {
	t.Parallel()
	url, simDir := capSim(t, "", 0, nil)
	st := doneStore(t, 3)
	cfg := testConfig(t, url)
	cfg.Concurrency, cfg.PerTurn, cfg.Shared, cfg.Lease = 1, true, true, 2*time.Second
	cl := &stealing{Client: cfg.Endpoints[0].Client, st: st, beforeAnswer: true}
	cfg.Endpoints[0].Client = cl
	sum, err := Run(context.Background(), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Captured != 4 || sum.Adopted != 0 || sum.LeasesLost != 1 || cl.sent.Load() != 5 {
		t.Errorf("summary %+v after %d requests; want 4 captured, 1 lease lost, 5 requests", sum, cl.sent.Load())
	}
	if len(listed(t, st, cfg)) != 4 {
		t.Error("want 4 files recorded")
	}
	left, err := os.ReadDir(simDir)
	must(t, err)
	if len(left) != 0 {
		t.Errorf("the server's folder holds %d entries, want none", len(left))
	}
}

// TestClearHandedOnWaitsForWriter: a handed-on file whose connector still
// holds its lock (vLLM answers before it writes) is removed only once the
// write ends, so the writer cannot recreate it after the removal.
func TestClearHandedOnWaitsForWriter(t *testing.T) {
	r, st := adoptRunner(t)
	ctx := context.Background()
	k := store.CaptureKey{Key: "s1", SampleID: "s1", Turn: store.WholeConversation, Input: "in"}
	p := filepath.Join(t.TempDir(), "cmpl-1-0"+Ext)
	lock, err := os.OpenFile(p+".lock", os.O_CREATE|os.O_WRONLY, 0o644)
	must(t, err)
	must(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	noteLapsed(t, st, k, p)
	c, ok, err := st.ClaimCapture(ctx, k, "cap", time.Minute)
	if err != nil || !ok || c.ServerPath != p {
		t.Fatalf("claim: %+v %v %v", c, ok, err)
	}
	written := make(chan error, 1)
	go func() { // the writer creates the file a while after the answer, then releases the lock
		time.Sleep(200 * time.Millisecond)
		err := os.WriteFile(p, []byte("hidden states"), 0o644)
		lock.Close()
		written <- err
	}()
	stop, err := r.clearHandedOn(ctx, c, filepath.Join(r.cfg.Dir, StableName(k.Key)+Ext))
	must(t, <-written)
	if stop || err != nil || exists(t, p) || exists(t, p+".lock") || r.sum.ServerLeftovers != 2 {
		t.Fatalf("clearHandedOn = %v, %v, removed %d; want the file written meanwhile and its lock removed", stop, err, r.sum.ServerLeftovers)
	}
}

// TestHandedOnStillLockedIsKept: a handed-on file whose writer still holds
// its lock past the wait is neither removed (the writer would recreate
// it) nor forgotten: its path stays noted for the next start to remove.
func TestHandedOnStillLockedIsKept(t *testing.T) {
	defer func(w time.Duration) { handedOnWait = w }(handedOnWait)
	handedOnWait = 50 * time.Millisecond
	r, st := adoptRunner(t)
	ctx := context.Background()
	k := store.CaptureKey{Key: "s1", SampleID: "s1", Turn: store.WholeConversation, Input: "in"}
	p := serverFile(t, t.TempDir(), "cmpl-1-0")
	lock, err := os.OpenFile(p+".lock", os.O_WRONLY, 0o644)
	must(t, err)
	defer lock.Close()
	must(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	noteLapsed(t, st, k, p)
	_, err = st.ReleaseCaptures(ctx, "") // a sole worker's start
	must(t, err)
	must(t, r.clearLeft(ctx))
	left, err := st.LeftServerPaths(ctx)
	if err != nil || left[k.Key] != p || !exists(t, p) || !exists(t, p+".lock") {
		t.Fatalf("after the start's clearing: noted %v (%v), file kept %v; want the file, its lock and its path kept", left, err, exists(t, p))
	}
	c, ok, err := st.ClaimCapture(ctx, k, "cap", time.Minute)
	if err != nil || !ok || c.ServerPath != p {
		t.Fatalf("claim: %+v %v %v", c, ok, err)
	}
	stop, err := r.clearHandedOn(ctx, c, filepath.Join(r.cfg.Dir, StableName(k.Key)+Ext))
	if stop || err != nil || !exists(t, p) || !exists(t, p+".lock") || r.sum.ServerLeftovers != 0 {
		t.Fatalf("clearHandedOn = %v, %v, removed %d; want the still-written file and its lock kept", stop, err, r.sum.ServerLeftovers)
	}
}

// TestUnremovableThroughAlias: a path naming the capture folder through a
// symbolic link (or the folder named through one) is recognised as inside.
func TestUnremovableThroughAlias(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "hidden_states")
	must(t, os.Mkdir(dir, 0o755))
	alias := filepath.Join(root, "alias")
	must(t, os.Symlink(dir, alias))
	dst := filepath.Join(dir, StableName("k")+Ext)
	for _, tc := range []struct{ path, dir string }{
		{filepath.Join(alias, "cmpl-1-0"+Ext), dir},
		{filepath.Join(dir, "cmpl-1-0"+Ext), alias},
	} {
		must(t, os.WriteFile(tc.path, nil, 0o644))
		if why := unremovable(tc.path, dst, tc.dir); why == "" {
			t.Errorf("unremovable(%q) with the folder %q: removable; want it kept (inside the folder)", tc.path, tc.dir)
		}
	}
	outside := filepath.Join(root, "cmpl-2-0"+Ext)
	if why := unremovable(outside, dst, alias); why != "" {
		t.Errorf("unremovable(%q) with the folder named by an alias = %q; want removable", outside, why)
	}
}
