package crew

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/regen-dev/regen/internal/store"
)

func ownerAt(dir, file string) Owner {
	return Owner{JobFile: file, JobPath: filepath.Join(dir, file), Dir: dir, Sources: []string{"p: data/a.jsonl"}}
}

// Own: the first job file owns the store; another is refused, read-only or
// not, before anything is written; the owner's folder moved is recorded.
func TestOwnRefusesAnotherJobFile(t *testing.T) {
	ctx := context.Background()
	st := open(t, filepath.Join(t.TempDir(), "job.db"))
	names := func() []string { return []string{"data/a.jsonl"} }
	a := ownerAt("/jobs/x", "a.yaml")
	if res, err := Own(ctx, st, a, names, "x.db", false); err != nil || res.Adopted {
		t.Fatalf("read-only Own of a new store = %+v, %v; want nothing recorded", res, err)
	}
	if v, ok, _ := st.Meta(ctx, ownerKey); ok {
		t.Fatalf("read-only Own recorded %s", v)
	}
	if res, err := Own(ctx, st, a, names, "x.db", true); err != nil || !res.Adopted {
		t.Fatalf("Own = %+v, %v; want a.yaml adopted", res, err)
	}
	recorded, _, _ := st.Meta(ctx, ownerKey)
	for _, write := range []bool{false, true} {
		_, err := Own(ctx, st, ownerAt("/jobs/x", "b.yaml"), names, "x.db", write)
		var fe *ForeignJobError
		if !errors.As(err, &fe) || fe.Recorded != "a.yaml" || fe.Requested != "b.yaml" {
			t.Errorf("Own of b.yaml (write %v) = %v, want a ForeignJobError naming a.yaml and b.yaml", write, err)
		}
		if now, _, _ := st.Meta(ctx, ownerKey); now != recorded {
			t.Errorf("refused Own changed the owner: %s -> %s", recorded, now)
		}
	}
	res, err := Own(ctx, st, ownerAt("/elsewhere/y", "a.yaml"), names, "x.db", true)
	if err != nil || res.MovedFrom != "/jobs/x" {
		t.Errorf("Own from a moved folder = %+v, %v; want moved from /jobs/x", res, err)
	}
	if res, err := Own(ctx, st, ownerAt("/elsewhere/y", "a.yaml"), names, "x.db", true); err != nil || res.MovedFrom != "" || res.Relocated != 0 {
		t.Errorf("Own again = %+v, %v; want nothing to do", res, err)
	}
}

// An earlier regen named files absolute: they become relative to the folder
// they were stored under, the job's or, for a folder moved before the
// upgrade, the one a stored name ending in a job file's name gives.
func TestOwnRelocatesAbsoluteNames(t *testing.T) {
	for _, tc := range []struct {
		name, stored, dir string
		want              int
	}{
		{"in place", "/jobs/x", "/jobs/x", 1},
		{"moved before the upgrade", "/old/x", "/jobs/y", 1},
		{"unrelated names", "/other", "/jobs/y", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t, filepath.Join(t.TempDir(), "job.db"))
			stored := "/other/b.jsonl:1"
			if tc.want > 0 {
				stored = tc.stored + "/data/a.jsonl:1"
			}
			if _, err := st.Ingest(ctx, []store.NewSample{{ID: "p/1", Partition: "p", Lane: "l", Body: []byte(`{}`), Origin: stored}}); err != nil {
				t.Fatal(err)
			}
			res, err := Own(ctx, st, ownerAt(tc.dir, "job.yaml"), func() []string { return []string{"data/a.jsonl"} }, "job.db", true)
			if err != nil || res.Relocated != tc.want {
				t.Errorf("Own = %+v, %v; want %d names relocated", res, err, tc.want)
			}
			if v, _, _ := st.Meta(ctx, pathsKey); v != "relative" {
				t.Errorf("paths = %q, want relative", v)
			}
		})
	}
}
