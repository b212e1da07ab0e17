package capture

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// adoptRunner is a runner over a fresh SQLite store and folder, as Run
// builds one, for calling adopt directly.
func adoptRunner(t *testing.T) (*runner, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "job.db"))
	must(t, err)
	t.Cleanup(func() { st.Close() })
	cfg, err := testConfig(t, "http://127.0.0.1:1").withDefaults()
	must(t, err)
	must(t, os.MkdirAll(cfg.Dir, 0o755))
	return &runner{cfg: cfg, st: st, eps: newEndpoints(cfg.Endpoints, cfg.DownAfter), dirSync: newDirSync(cfg.Dir)}, st
}

// syncRecorder is a store that notes, at each RecordCapture, how many
// folder syncs had ended by then.
type syncRecorder struct {
	Store
	syncs    *int
	atRecord []int
}

func (s *syncRecorder) RecordCapture(ctx context.Context, c store.CaptureClaim, f store.CapturedFile) error {
	s.atRecord = append(s.atRecord, *s.syncs)
	return s.Store.RecordCapture(ctx, c, f)
}

// TestAdoptSyncsFolderBeforeRecord: a file a killed run placed (it may
// have died between its rename and the folder's fsync) is recorded only
// after a sync of the folder.
func TestAdoptSyncsFolderBeforeRecord(t *testing.T) {
	syncs := 0
	dirSyncer = func(dir string) error { syncs++; return syncDir(dir) }
	t.Cleanup(func() { dirSyncer = syncDir })
	r, st := adoptRunner(t)
	rec := &syncRecorder{Store: st, syncs: &syncs}
	r.st = rec
	r.dirSync = newDirSync(r.cfg.Dir)
	k := store.CaptureKey{Key: "s1", SampleID: "s1", Turn: store.WholeConversation, Input: "in"}
	c, ok, err := st.ClaimCapture(context.Background(), k, "cap", time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	dst := filepath.Join(r.cfg.Dir, StableName(k.Key)+Ext)
	goodFile(ids(12), 2, 8).write(t, dst)
	done, err := r.adopt(context.Background(), c, ids(12), dst)
	if !done || err != nil || r.sum.Adopted != 1 {
		t.Fatalf("adopt: %v, %v, summary %+v", done, err, r.sum)
	}
	if len(rec.atRecord) != 1 || rec.atRecord[0] < 1 {
		t.Fatalf("folder syncs ended before each record: %v; want at least one before the adopted file's record", rec.atRecord)
	}
}

// TestAdoptLeavesNewHoldersFile: a worker whose lease was lost (the key
// claimed again and recorded by another) finds the file at the key's name
// failing its check (its ids are not the holder's): it leaves the file in
// place. A worker that still holds the key, among others, sets such a
// file aside under a temporary name Sweep removes, and deletes nothing.
func TestAdoptLeavesNewHoldersFile(t *testing.T) {
	ctx := context.Background()
	r, st := adoptRunner(t)
	k := store.CaptureKey{Key: "s1", SampleID: "s1", Turn: store.WholeConversation, Input: "old"}
	old, _, err := st.ClaimCapture(ctx, k, "lapsed", time.Minute)
	must(t, err)
	must(t, st.ReleaseCapture(ctx, old)) // as a lapsed lease ends: the key is claimable again
	k.Input = "new"
	holder, ok, err := st.ClaimCapture(ctx, k, "holder", time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim by the new holder: %v %v", ok, err)
	}
	dst := filepath.Join(r.cfg.Dir, StableName(k.Key)+Ext)
	goodFile(ids(12), 2, 8).write(t, dst)
	want, err := os.ReadFile(dst)
	must(t, err)
	info, err := CheckFile(dst, ids(12), Expect{})
	must(t, err)
	must(t, st.RecordCapture(ctx, holder, store.CapturedFile{CaptureKey: k, Path: StableName(k.Key) + Ext, Bytes: info.Bytes, SHA256: info.SHA256,
		Tokens: 12, Layers: 2, Hidden: 8, DType: info.DType}))

	done, err := r.adopt(ctx, old, ids(9), dst) // the lapsed worker's ids differ
	if !done || err != nil {
		t.Fatalf("adopt under a lost lease: %v, %v; want done, no error", done, err)
	}
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the holder's recorded file after a lapsed worker's adopt: %v (%d bytes, want %d)", err, len(got), len(want))
	}

	// Under a live lease, with other workers, the stale file is renamed
	// aside, not deleted.
	r.cfg.Shared = true
	k2 := store.CaptureKey{Key: "s2", SampleID: "s2", Turn: store.WholeConversation, Input: "in"}
	c2, _, err := st.ClaimCapture(ctx, k2, "cap", time.Minute)
	must(t, err)
	dst2 := filepath.Join(r.cfg.Dir, StableName(k2.Key)+Ext)
	goodFile(ids(12), 2, 8).write(t, dst2)
	done, err = r.adopt(ctx, c2, ids(9), dst2)
	if done || err != nil || r.sum.SetAside != 1 {
		t.Fatalf("adopt of a stale file under a live lease: %v, %v, summary %+v; want it set aside and the key still to capture", done, err, r.sum)
	}
	if _, err := os.Stat(dst2); !os.IsNotExist(err) {
		t.Errorf("the stale file is still at the key's name: %v", err)
	}
	entries, err := os.ReadDir(r.cfg.Dir)
	must(t, err)
	var parts []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), partPrefix) {
			parts = append(parts, e.Name())
		}
	}
	if len(parts) != 1 {
		t.Fatalf("temporary names in the folder: %v; want the set-aside file", parts)
	}
	if n, err := Sweep(r.cfg.Dir, 0); err != nil || n != 1 {
		t.Errorf("Sweep: %d, %v; want the set-aside file removed", n, err)
	}
}
