// Package backend opens a job's store: the embedded SQLite file by default,
// or a shared PostgreSQL database named by the job file's store.dsn or,
// overriding it, the REGEN_STORE environment variable. Every command opens
// its store here, so they all agree on where a job lives.
//
// A PostgreSQL job lives in a schema named after the job (see
// postgres.SchemaFor), so jobs can share one database. Passwords belong in
// PGPASSWORD or a PGPASSFILE (or in REGEN_STORE), never in a job file, and
// every description of a store this package returns has them removed.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// EnvStore names the environment variable that overrides a job file's
// store.dsn (a SQLite path, sqlite:path or postgres://...).
const EnvStore = "REGEN_STORE"

// Target is where a job's store is.
type Target struct {
	Backend string // "sqlite" or "postgres"
	Path    string // SQLite: the database file
	Schema  string // PostgreSQL: the job's schema
	From    string // where the choice came from: "store.dsn", "REGEN_STORE" or "default"
	dsn     string // PostgreSQL: the DSN as given (it may hold a password)
}

// String describes the target without any password.
func (t Target) String() string {
	if t.Backend == "postgres" {
		return fmt.Sprintf("%s (schema %s)", postgres.Redact(t.dsn), t.Schema)
	}
	return t.Path
}

// Shared reports whether several workers may run the job at once.
func (t Target) Shared() bool { return t.Backend == "postgres" }

// Resolve decides where spec's store is, from REGEN_STORE when set, else
// from the job file.
func Resolve(spec *job.Spec) (Target, error) {
	if env := strings.TrimSpace(os.Getenv(EnvStore)); env != "" {
		t, err := parse(env, spec)
		if err != nil {
			return Target{}, fmt.Errorf("%s: %w", EnvStore, err)
		}
		t.From = EnvStore
		if t.Backend == "sqlite" && !filepath.IsAbs(t.Path) {
			if abs, err := filepath.Abs(t.Path); err == nil {
				t.Path = abs
			}
		}
		return t, nil
	}
	t, err := parse(spec.Store.DSN, spec)
	if err != nil {
		return Target{}, fmt.Errorf("%s: store.dsn: %w", spec.Path, err)
	}
	t.From = "store.dsn"
	return t, nil
}

func parse(dsn string, spec *job.Spec) (Target, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		if _, err := url.Parse(dsn); err != nil {
			return Target{}, fmt.Errorf("not a valid postgres:// URL: %s", postgres.Redact(dsn))
		}
		return Target{Backend: "postgres", dsn: dsn, Schema: postgres.SchemaFor(spec.Name)}, nil
	case strings.Contains(dsn, "://"):
		return Target{}, fmt.Errorf("unknown store %q (want a SQLite file path, sqlite:path or postgres://...)", postgres.Redact(dsn))
	}
	p := strings.TrimPrefix(dsn, "sqlite:")
	if p == "" {
		return Target{}, errors.New("a SQLite store needs a file path")
	}
	return Target{Backend: "sqlite", Path: p}, nil
}

// Options tune Open.
type Options struct {
	// Create makes a store that does not exist yet (run does; status,
	// export and requeue do not, and report store.ErrNoStore instead).
	Create bool
}

// Open resolves and opens spec's store.
func Open(ctx context.Context, spec *job.Spec, o Options) (store.Store, Target, error) {
	t, err := Resolve(spec)
	if err != nil {
		return nil, t, err
	}
	st, err := OpenTarget(ctx, t, o)
	return st, t, err
}

// OpenTarget opens the store at t.
func OpenTarget(ctx context.Context, t Target, o Options) (store.Store, error) {
	switch t.Backend {
	case "postgres":
		st, err := postgres.Open(ctx, t.dsn, postgres.Options{Schema: t.Schema, NoCreate: !o.Create})
		if err != nil {
			return nil, err
		}
		return st, nil
	case "sqlite":
		if !o.Create {
			if _, err := os.Stat(t.Path); errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("open store %s: %w", t.Path, store.ErrNoStore)
			}
		}
		st, err := sqlite.Open(t.Path)
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	return nil, fmt.Errorf("unknown store backend %q", t.Backend)
}

// Unreachable reports whether err says the store could not be reached at
// all (connection refused, timed out, server shutting down), as opposed to
// a store that answered with an error.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 57: the server is shutting down or restarting; 08: connection.
		return strings.HasPrefix(pe.Code, "57") || strings.HasPrefix(pe.Code, "08")
	}
	return pgconn.SafeToRetry(err) || errors.Is(err, io.ErrUnexpectedEOF)
}
