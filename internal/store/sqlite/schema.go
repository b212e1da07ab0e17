package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// schemaVersion is stored in PRAGMA user_version. Bump it and add a step to
// migrations when the schema changes; a file written by a newer binary is
// refused rather than guessed at.
const schemaVersion = 3

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
	// 1 -> 2: one heartbeat per worker, events tagged by worker, and the
	// ingest manifest.
	`
CREATE TABLE heartbeats (
	owner    TEXT    PRIMARY KEY,
	pid      INTEGER NOT NULL,
	host     TEXT    NOT NULL,
	time     INTEGER NOT NULL,
	started  INTEGER NOT NULL,
	counters BLOB    NOT NULL
);
CREATE INDEX heartbeats_time ON heartbeats (time);
INSERT INTO heartbeats (owner, pid, host, time, started, counters)
	SELECT owner, pid, host, time, started, counters FROM heartbeat;
DROP TABLE heartbeat;

ALTER TABLE events ADD COLUMN worker TEXT NOT NULL DEFAULT '';

CREATE TABLE source_files (
	partition   TEXT    NOT NULL,
	path        TEXT    NOT NULL,
	size        INTEGER NOT NULL,
	mod_time    INTEGER NOT NULL,
	fingerprint TEXT    NOT NULL,
	rows        INTEGER NOT NULL,
	bad         INTEGER NOT NULL,
	complete    INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	PRIMARY KEY (partition, path)
) WITHOUT ROWID;
`,
	// 2 -> 3: a smaller row. A sample's origin ("file:line") keeps its file
	// in a table of its own (a job has few files and up to 10^7 rows);
	// created_at, never read, goes; and Ingest keeps the counts once per
	// batch instead of a trigger per row.
	`
CREATE TABLE origins (
	id     INTEGER PRIMARY KEY,
	prefix TEXT NOT NULL UNIQUE -- the origin up to and including its last ':'
);
ALTER TABLE samples ADD COLUMN origin_file INTEGER NOT NULL DEFAULT 0;
ALTER TABLE samples ADD COLUMN origin_pos TEXT NOT NULL DEFAULT '';
-- rtrim(o, replace(o, ':', '')) is o up to its last ':' (SQLite has no
-- last-index function).
INSERT OR IGNORE INTO origins (prefix) SELECT DISTINCT rtrim(origin, replace(origin, ':', '')) FROM samples;
UPDATE samples SET
	origin_file = (SELECT id FROM origins WHERE prefix = rtrim(samples.origin, replace(samples.origin, ':', ''))),
	origin_pos = substr(origin, length(rtrim(origin, replace(origin, ':', ''))) + 1);
ALTER TABLE samples DROP COLUMN origin;
ALTER TABLE samples DROP COLUMN created_at;
DROP TRIGGER samples_count_insert;
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
