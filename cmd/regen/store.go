package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/regen-dev/regen/internal/crew"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/source"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/backend"
)

// openStore opens the job's store, creating it if needed (regen run), and
// makes it this job file's (or refuses another job file's store).
func openStore(ctx context.Context, spec *job.Spec) (store.Store, error) {
	st, t, err := backend.Open(ctx, spec, backend.Options{Create: true})
	if err != nil {
		return nil, err
	}
	return st, own(ctx, spec, st, t, true)
}

// openExisting opens the job's store for a command that needs a job that
// has run; otherwise the error says so, ending with hint. Another job
// file's store is refused.
func openExisting(ctx context.Context, spec *job.Spec, hint string) (store.Store, error) {
	st, t, err := backend.Open(ctx, spec, backend.Options{})
	if errors.Is(err, store.ErrNoStore) {
		return nil, fmt.Errorf("job %s has no store yet (%s): %s: %w", spec.Name, t, hint, store.ErrNoStore)
	}
	if err != nil {
		return nil, err
	}
	return st, own(ctx, spec, st, t, false)
}

// own checks (and with write records) that st belongs to spec's job file;
// it closes st when it does not.
func own(ctx context.Context, spec *job.Spec, st store.Store, t backend.Target, write bool) error {
	res, err := crew.Own(ctx, st, ownerOf(spec, t), func() []string { return sourceNames(spec) }, spec.Rel(t.String()), write)
	if err != nil {
		st.Close()
		return err
	}
	if res.MovedFrom != "" {
		fmt.Fprintf(os.Stderr, "regen: job %s moved from %s to %s: the same job, its samples kept\n", spec.Name, res.MovedFrom, spec.Dir)
	}
	if res.Relocated > 0 {
		fmt.Fprintf(os.Stderr, "regen: %d source file names in the store of job %s now relative to the job file\n", res.Relocated, spec.Name)
	}
	return nil
}

// ownerOf identifies spec's job file for its store at t: by its path
// relative to a SQLite store's folder, by its base name for a shared store
// (hosts mount the job's folder in different places).
func ownerOf(spec *job.Spec, t backend.Target) crew.Owner {
	file := filepath.Join(spec.Dir, filepath.Base(spec.Path))
	o := crew.Owner{JobFile: filepath.Base(file), JobPath: spec.Path, Dir: spec.Dir, Shared: t.Shared()}
	if !t.Shared() {
		if abs, err := filepath.Abs(t.Path); err == nil {
			if rel, err := filepath.Rel(filepath.Dir(abs), file); err == nil {
				o.JobFile = rel
			}
		}
	}
	for _, src := range spec.Sources {
		o.Sources = append(o.Sources, src.Partition+": "+spec.Rel(src.Path))
	}
	return o
}

// sourceNames lists the job's source files as the store names them.
func sourceNames(spec *job.Spec) []string {
	var out []string
	for _, src := range spec.Sources {
		files, err := source.Files(src, spec.Dir)
		if err != nil {
			continue // ingest reports it
		}
		for _, f := range files {
			out = append(out, spec.Rel(f))
		}
	}
	return out
}
