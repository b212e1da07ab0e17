package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
		// pg_stat_statements says which statements the database's time
		// goes to (the ceiling case); 32 worker processes with their pools
		// need more than the default connections.
		pgServer, pgErr = pgtest.Start(pgtest.Options{Durable: true,
			Settings: []string{"shared_preload_libraries=pg_stat_statements", "max_connections=400"}})
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

// pgCPU is the CPU time of the PostgreSQL server this harness started (the
// postmaster and its backends), 0 when none runs: the database's share of
// a measurement, which the process's own rusage does not include.
func pgCPU() time.Duration {
	var ticks int64
	for _, t := range pgTicks() {
		ticks += t
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// pgTicks is the CPU time of each process of the server (the postmaster
// and its backends) in clock ticks, by pid.
func pgTicks() map[int]int64 {
	out := map[int]int64{}
	if pgServer == nil {
		return out
	}
	root := pgServer.PID()
	if root == 0 {
		return out
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command may hold spaces and parentheses: fields start after
		// the last ')'. Then: state ppid ... utime(12th) stime(13th).
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != root && ppid != root {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[pid] = u + st
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc/*/stat times: 100 on Linux.
const clockTicks = 100
