package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// schemaVersion is stored in PRAGMA user_version. Bump it and add a step to
// migrations when the schema changes; a file written by a newer binary is
// refused rather than guessed at.
const schemaVersion = 2

// migrations[i] takes a file from user_version i to i+1.
var migrations = []string{
	// 0 -> 1: the first schema.
	`
CREATE TABLE samples (
	seq           INTEGER PRIMARY KEY, -- creation order; an alias of rowid, so VACUUM keeps it
	id            TEXT    NOT NULL UNIQUE,
	partition     TEXT    NOT NULL,
	lane          TEXT    NOT NULL,
	body          BLOB    NOT NULL,
	prompt_tokens INTEGER NOT NULL,
	origin        TEXT    NOT NULL,
	state         TEXT    NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'rejected', 'dead')),
	attempts      INTEGER NOT NULL DEFAULT 0,
	not_before    INTEGER NOT NULL DEFAULT 0, -- unix ns
	lease_owner   TEXT,
	lease_until   INTEGER,
	last_error    TEXT,
	last_error_at INTEGER,
	created_at    INTEGER NOT NULL,
	finished_at   INTEGER -- set exactly when state is done, rejected or dead
);

-- Claim takes the oldest due samples from two partial indexes: samples never
-- told to wait (not_before = 0) in creation order, and samples waiting for a
-- retry time, by that time, so the ones not yet due are never scanned
-- however many there are. Claim resets not_before to 0.
CREATE INDEX samples_ready ON samples (lane, seq) WHERE state = 'pending' AND not_before = 0;
CREATE INDEX samples_waiting ON samples (lane, not_before, seq) WHERE state = 'pending' AND not_before > 0;
-- ExtendLeases, ReleaseOwner and ExpireLeases read only leased rows
-- (bounded by concurrency, not job size).
CREATE INDEX samples_leased ON samples (lease_owner, lease_until) WHERE state = 'leased';
-- Finished pages through finished samples in id order.
CREATE INDEX samples_finished ON samples (id) WHERE finished_at IS NOT NULL;
CREATE INDEX samples_errors ON samples (last_error_at) WHERE last_error_at IS NOT NULL;

-- One result per sample: the primary key is the exactly-once guarantee.
CREATE TABLE results (
	sample_id         TEXT    PRIMARY KEY REFERENCES samples (id),
	response          BLOB    NOT NULL,
	finish_reason     TEXT    NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	endpoint          TEXT    NOT NULL,
	duration_ns       INTEGER NOT NULL,
	ttft_ns           INTEGER NOT NULL,
	reason            TEXT    NOT NULL DEFAULT '', -- reject reason, '' when done
	finished_at       INTEGER NOT NULL
);
-- Covering, so ThroughputSince never reads the response blobs.
CREATE INDEX results_finished_at ON results (finished_at, prompt_tokens, completion_tokens);

CREATE TABLE ingest_errors (
	seq        INTEGER PRIMARY KEY,
	origin     TEXT    NOT NULL UNIQUE,
	partition  TEXT    NOT NULL,
	field      TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	created_at INTEGER NOT NULL
);

CREATE TABLE heartbeat (
	id       INTEGER PRIMARY KEY CHECK (id = 1),
	owner    TEXT    NOT NULL,
	pid      INTEGER NOT NULL,
	host     TEXT    NOT NULL,
	time     INTEGER NOT NULL,
	started  INTEGER NOT NULL,
	counters BLOB    NOT NULL
);

CREATE TABLE events (
	id       INTEGER PRIMARY KEY AUTOINCREMENT,
	time     INTEGER NOT NULL,
	kind     TEXT    NOT NULL,
	subject  TEXT    NOT NULL,
	state    TEXT    NOT NULL,
	evidence TEXT    NOT NULL
);

-- counts is kept by triggers in the same transaction as every state change,
-- so Counts reads a handful of rows instead of grouping 10^6 samples.
CREATE TABLE counts (
	partition TEXT    NOT NULL,
	lane      TEXT    NOT NULL,
	state     TEXT    NOT NULL,
	n         INTEGER NOT NULL,
	PRIMARY KEY (partition, lane, state)
) WITHOUT ROWID;

CREATE TRIGGER samples_count_insert AFTER INSERT ON samples BEGIN
	INSERT INTO counts (partition, lane, state, n) VALUES (new.partition, new.lane, new.state, 1)
	ON CONFLICT (partition, lane, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER samples_count_update AFTER UPDATE OF state, lane, partition ON samples
WHEN old.state IS NOT new.state OR old.lane IS NOT new.lane OR old.partition IS NOT new.partition BEGIN
	UPDATE counts SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND state = old.state;
	INSERT INTO counts (partition, lane, state, n) VALUES (new.partition, new.lane, new.state, 1)
	ON CONFLICT (partition, lane, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER samples_count_delete AFTER DELETE ON samples BEGIN
	UPDATE counts SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND state = old.state;
END;
`,
	// 1 -> 2: dashboard history and the sample browser's listings.
	`
-- One row per minute, worker and endpoint ('' = the worker's totals); the
-- runner rewrites the current minute's row as it goes.
CREATE TABLE minutes (
	time      INTEGER NOT NULL, -- unix ns of the minute's start
	worker    TEXT    NOT NULL,
	endpoint  TEXT    NOT NULL,
	samples   INTEGER NOT NULL,
	tokens    INTEGER NOT NULL,
	requests  INTEGER NOT NULL,
	errors    INTEGER NOT NULL,
	in_flight INTEGER NOT NULL,
	kv_usage  REAL    NOT NULL,
	queued    REAL    NOT NULL,
	running   REAL    NOT NULL,
	lim       INTEGER NOT NULL,
	PRIMARY KEY (time, worker, endpoint)
) WITHOUT ROWID;

-- Samples pages through a partition in id order, and through the rare
-- failed states without scanning the done ones. Neither column set changes
-- on the hot transitions (claim, complete), so they cost only at ingest.
CREATE INDEX samples_partition ON samples (partition, id);
CREATE INDEX samples_dead ON samples (id) WHERE state = 'dead';
CREATE INDEX samples_rejected ON samples (id) WHERE state = 'rejected';
`,
}

// migrate brings the file to schemaVersion in one transaction, so a crash
// mid-migration leaves the old version intact.
func migrate(ctx context.Context, db *sql.DB) error {
	var v int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > schemaVersion {
		return fmt.Errorf("schema version %d is newer than this binary's %d", v, schemaVersion)
	}
	if v == schemaVersion {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer tx.Rollback()
	for i := v; i < schemaVersion; i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migrate schema %d to %d: %w", i, i+1, err)
		}
	}
	// PRAGMA takes no bound parameters; the value is our own constant.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", schemaVersion)); err != nil {
		return fmt.Errorf("set schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}
