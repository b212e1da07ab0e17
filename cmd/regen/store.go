package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/regen-dev/regen/internal/crew"
	"github.com/regen-dev/regen/internal/job"
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
	res, err := crew.OwnJob(ctx, st, spec, crew.Place{Path: t.Path, Name: t.String(), Shared: t.Shared()}, write)
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
