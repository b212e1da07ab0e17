package crew

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// A store belongs to one job file. Two job files with the same name in one
// folder resolve to the same store; without a record of its owner the
// second would run, ingest and export in the first one's store. A job
// folder moved whole (the job file beside its store, the folder renamed)
// is the same job: the job file's name relative to the store is the same.

// Owner identifies the job file a store belongs to.
type Owner struct {
	// JobFile is the job file's path relative to the store's folder for a
	// SQLite store; for a shared store, whose hosts mount the job's folder
	// in different places, its base name.
	JobFile string `json:"job_file"`
	// JobPath is the job file as messages name it (relative to the working
	// directory or absolute); Dir is its folder, absolute.
	JobPath string `json:"job_path"`
	Dir     string `json:"dir"`
	// Sources are "partition: path" as the job file writes them.
	Sources []string `json:"sources"`
	// Shared: several hosts run the job, each from its own folder, so the
	// folder is not the job's (a move is not recorded).
	Shared bool `json:"shared,omitempty"`
}

// Meta keys.
const (
	ownerKey = "owner"
	// pathsKey is "relative" once the source files the store names are
	// named relative to the job file (regen before it stored them absolute).
	pathsKey = "paths"
)

// OwnerStore is what Own reads and changes.
type OwnerStore interface {
	Meta(ctx context.Context, key string) (string, bool, error)
	SetMeta(ctx context.Context, key, value string, replace bool) (string, error)
	OriginFiles(ctx context.Context) ([]string, error)
	Relocate(ctx context.Context, from string) (int, error)
}

// ForeignJobError refuses a job file whose store another job file owns.
type ForeignJobError struct {
	Store     string // the store, as messages name it
	Owner     Owner  // the recorded owner
	Want      Owner  // the job file refused
	Recorded  string // Owner's job file as the message names it
	Requested string // Want's job file as the message names it
}

func (e *ForeignJobError) Error() string {
	return fmt.Sprintf("store %s belongs to job file %s (sources %s), not to %s, which resolves to the same store (a store is named after the job's name:); "+
		"give %s a name: (or a store:) of its own, or run %s; nothing was written to the store",
		e.Store, e.Recorded, strings.Join(e.Owner.Sources, ", "), e.Requested, e.Requested, e.Recorded)
}

// OwnResult says what Own found and did.
type OwnResult struct {
	Adopted   bool   // no owner was recorded: want is now
	MovedFrom string // the job's folder before it was moved ("" if not)
	Relocated int    // source file names made relative to the job file
}

// Own checks that st belongs to want's job file. A store with no owner
// recorded (new, or written by a regen from before owners) becomes want's
// when write is set; a read-only look records nothing. With write, a job
// folder moved since the last run is recorded, and names stored absolute
// by an earlier regen are made relative to the job file's folder (names
// lists the job's source files that way, to find a folder moved before the
// upgrade). A foreign owner is a *ForeignJobError, before any write.
func Own(ctx context.Context, st OwnerStore, want Owner, names func() []string, storeName string, write bool) (OwnResult, error) {
	var res OwnResult
	rec, ok, err := owner(ctx, st)
	if err != nil {
		return res, err
	}
	if ok && rec.JobFile != want.JobFile {
		return res, foreign(storeName, rec, want)
	}
	if !write {
		return res, nil
	}
	if !ok {
		b, err := json.Marshal(want)
		if err != nil {
			return res, err
		}
		got, err := st.SetMeta(ctx, ownerKey, string(b), false)
		if err != nil {
			return res, err
		}
		if rec, err = parseOwner(got); err != nil {
			return res, err
		}
		if rec.JobFile != want.JobFile { // another job file recorded itself first
			return res, foreign(storeName, rec, want)
		}
		res.Adopted = true
	}
	if res.Relocated, err = relocate(ctx, st, want.Dir, names); err != nil {
		return res, err
	}
	if want.Shared {
		rec.Dir, rec.JobPath = want.Dir, want.JobPath
	}
	if rec.Dir != want.Dir || !slices.Equal(rec.Sources, want.Sources) || rec.JobPath != want.JobPath {
		if !res.Adopted && rec.Dir != want.Dir {
			res.MovedFrom = rec.Dir
		}
		b, err := json.Marshal(want)
		if err != nil {
			return res, err
		}
		if _, err := st.SetMeta(ctx, ownerKey, string(b), true); err != nil {
			return res, err
		}
	}
	return res, nil
}

func owner(ctx context.Context, st OwnerStore) (Owner, bool, error) {
	v, ok, err := st.Meta(ctx, ownerKey)
	if err != nil || !ok {
		return Owner{}, false, err
	}
	o, err := parseOwner(v)
	return o, err == nil, err
}

func parseOwner(v string) (Owner, error) {
	var o Owner
	if err := json.Unmarshal([]byte(v), &o); err != nil {
		return Owner{}, fmt.Errorf("read the store's owner: %w", err)
	}
	return o, nil
}

// foreign names both job files relative to want's folder.
// A shared store's owner is named by its base name: its folder is on
// another host.
func foreign(storeName string, rec, want Owner) *ForeignJobError {
	recorded := relTo(want.Dir, filepath.Join(rec.Dir, filepath.Base(rec.JobPath)))
	if want.Shared {
		recorded = rec.JobFile
	}
	return &ForeignJobError{Store: storeName, Owner: rec, Want: want, Recorded: recorded, Requested: relTo(want.Dir, want.JobPath)}
}

func relTo(dir, p string) string {
	if !filepath.IsAbs(p) {
		return p
	}
	if r, err := filepath.Rel(dir, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// relocate makes the names an earlier regen stored absolute relative to
// the job file's folder, once: from the folder they were stored under,
// dir unless the folder moved before this regen recorded it (then found
// from a stored name ending in one of names).
func relocate(ctx context.Context, st OwnerStore, dir string, names func() []string) (int, error) {
	if v, ok, err := st.Meta(ctx, pathsKey); err != nil || (ok && v == "relative") {
		return 0, err
	}
	files, err := st.OriginFiles(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	if from := storedUnder(files, dir, names); from != "" {
		if n, err = st.Relocate(ctx, from); err != nil {
			return 0, err
		}
	}
	if _, err := st.SetMeta(ctx, pathsKey, "relative", true); err != nil {
		return 0, err
	}
	return n, nil
}

// storedUnder returns the folder the absolute names in files were stored
// under: dir when one is under it, else the folder that a name ending in
// one of names() (the job's files relative to the job file) gives; ""
// when none is.
func storedUnder(files []string, dir string, names func() []string) string {
	sep := string(filepath.Separator)
	for _, f := range files {
		if strings.HasPrefix(f, dir+sep) {
			return dir
		}
	}
	if len(files) == 0 {
		return ""
	}
	rel := names()
	for _, f := range files {
		for _, n := range rel {
			if !filepath.IsAbs(n) && strings.HasSuffix(f, sep+n) && filepath.IsAbs(f) {
				return strings.TrimSuffix(f, sep+n)
			}
		}
	}
	return ""
}
