package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/backend"
)

// openStore opens the job's store, creating it if needed (regen run).
func openStore(ctx context.Context, spec *job.Spec) (store.Store, error) {
	st, _, err := backend.Open(ctx, spec, backend.Options{Create: true})
	return st, err
}

// openExisting opens the job's store for a command that needs a job that
// has run; otherwise the error says so, ending with hint.
func openExisting(ctx context.Context, spec *job.Spec, hint string) (store.Store, error) {
	st, t, err := backend.Open(ctx, spec, backend.Options{})
	if errors.Is(err, store.ErrNoStore) {
		return nil, fmt.Errorf("job %s has no store yet (%s): %s: %w", spec.Name, t, hint, store.ErrNoStore)
	}
	return st, err
}
