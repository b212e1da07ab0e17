package main

import (
	"fmt"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// storePath is the file behind the job's store (the DSN itself for a
// backend without a file).
func storePath(spec *job.Spec) string {
	if p, ok := spec.Store.SQLitePath(); ok {
		return p
	}
	return spec.Store.DSN
}

// openStore opens the job's store, creating a SQLite file if needed.
func openStore(spec *job.Spec) (store.Store, error) {
	p, ok := spec.Store.SQLitePath()
	if !ok {
		return nil, fmt.Errorf("store %s: only SQLite stores are available in this build", spec.Store.DSN)
	}
	st, err := sqlite.Open(p)
	if err != nil {
		return nil, err
	}
	return st, nil
}
