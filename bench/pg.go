package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// The PostgreSQL cases share one server, started on first use with fsync
// on (as in production: every commit waits for the WAL to reach the disk)
// and stopped when the harness exits.
var (
	pgOnce   sync.Once
	pgServer *pgtest.Server
	pgErr    error
	pgDB     string
	pgSeq    atomic.Int64
)

func pgStart(ctx context.Context) (string, error) {
	pgOnce.Do(func() {
		pgServer, pgErr = pgtest.Start(pgtest.Options{Durable: true})
		if pgErr != nil {
			pgErr = fmt.Errorf("start PostgreSQL: %w", pgErr)
			return
		}
		pgDB = pgServer.DSN("regen_bench")
		pgErr = pgServer.Exec(ctx, "postgres", "CREATE DATABASE regen_bench")
	})
	return pgDB, pgErr
}

// pgStop stops the server if a case started one.
func pgStop() {
	if pgServer != nil {
		_ = pgServer.Stop()
	}
}

// pgOpen opens the store of schema o.Schema in the bench's database.
func pgOpen(ctx context.Context, o postgres.Options) (*postgres.Store, error) {
	dsn, err := pgStart(ctx)
	if err != nil {
		return nil, err
	}
	return postgres.Open(ctx, dsn, o)
}

// pgSchema names a new schema for one measurement.
func pgSchema(what string) string { return fmt.Sprintf("bench_%s_%d", what, pgSeq.Add(1)) }
