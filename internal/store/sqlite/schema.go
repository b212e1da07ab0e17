package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// schemaVersion is stored in PRAGMA user_version. Bump it and add a step to
// migrations when the schema changes; a file written by a newer binary is
// refused rather than guessed at.
const schemaVersion = 13

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
	// 1 -> 2: multi-turn regeneration, quality rejects, dataset statistics,
	// duplicate ids at ingest.
	`
-- The next turn to generate; 0 for every sample written before.
ALTER TABLE samples ADD COLUMN turn INTEGER NOT NULL DEFAULT 0;

-- The answers to every turn of a multi-turn sample but its last (which is
-- in results). The primary key is the exactly-once guarantee per turn.
CREATE TABLE turns (
	sample_id         TEXT    NOT NULL REFERENCES samples (id),
	turn              INTEGER NOT NULL,
	partition         TEXT    NOT NULL,
	lane              TEXT    NOT NULL,
	response          BLOB    NOT NULL,
	finish_reason     TEXT    NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	reasoning_tokens  INTEGER NOT NULL,
	endpoint          TEXT    NOT NULL,
	duration_ns       INTEGER NOT NULL,
	ttft_ns           INTEGER NOT NULL,
	attempts          INTEGER NOT NULL,
	finished_at       INTEGER NOT NULL,
	PRIMARY KEY (sample_id, turn)
);
-- Covering, so ThroughputSince never reads the response blobs.
CREATE INDEX turns_finished_at ON turns (finished_at, prompt_tokens, completion_tokens);

ALTER TABLE results ADD COLUMN turn INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN partition TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN lane TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN rule TEXT NOT NULL DEFAULT ''; -- the quality rule of a reject
ALTER TABLE results ADD COLUMN end_reason TEXT NOT NULL DEFAULT '';
UPDATE results SET partition = s.partition, lane = s.lane FROM samples s WHERE s.id = results.sample_id;
-- Rejects stored before rules had names.
UPDATE results SET rule = 'unnamed' WHERE reason <> '';
CREATE INDEX results_rule ON results (rule) WHERE rule <> '';

-- Statistics, kept by triggers in the same transaction as every stored
-- answer, so regen stats reads a few thousand rows whatever the job size.
CREATE TABLE stat_cells (
	partition         TEXT    NOT NULL,
	lane              TEXT    NOT NULL,
	requests          INTEGER NOT NULL,
	truncated         INTEGER NOT NULL,
	rejected          INTEGER NOT NULL,
	with_reasoning    INTEGER NOT NULL,
	ended             INTEGER NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	reasoning_tokens  INTEGER NOT NULL,
	PRIMARY KEY (partition, lane)
) WITHOUT ROWID;
-- One row per distinct token count, so percentiles are exact.
CREATE TABLE stat_tokens (
	partition TEXT    NOT NULL,
	lane      TEXT    NOT NULL,
	kind      TEXT    NOT NULL CHECK (kind IN ('prompt', 'completion')),
	tokens    INTEGER NOT NULL,
	n         INTEGER NOT NULL,
	PRIMARY KEY (partition, lane, kind, tokens)
) WITHOUT ROWID;
CREATE TABLE stat_minutes (
	minute            INTEGER PRIMARY KEY, -- unix minutes
	requests          INTEGER NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL
);
CREATE TABLE stat_rejects (
	partition TEXT    NOT NULL,
	lane      TEXT    NOT NULL,
	rule      TEXT    NOT NULL,
	n         INTEGER NOT NULL,
	PRIMARY KEY (partition, lane, rule)
) WITHOUT ROWID;

INSERT INTO stat_cells SELECT partition, lane, count(*), sum(finish_reason = 'length'), sum(rule <> ''),
	sum(reasoning_tokens > 0), sum(end_reason <> ''), sum(prompt_tokens), sum(completion_tokens), sum(reasoning_tokens)
	FROM results GROUP BY partition, lane;
INSERT INTO stat_tokens SELECT partition, lane, 'prompt', prompt_tokens, count(*) FROM results GROUP BY partition, lane, prompt_tokens;
INSERT INTO stat_tokens SELECT partition, lane, 'completion', completion_tokens, count(*) FROM results GROUP BY partition, lane, completion_tokens;
INSERT INTO stat_minutes SELECT finished_at / 60000000000, count(*), sum(prompt_tokens), sum(completion_tokens) FROM results GROUP BY 1;
INSERT INTO stat_rejects SELECT partition, lane, rule, count(*) FROM results WHERE rule <> '' GROUP BY partition, lane, rule;

CREATE TRIGGER results_stats_insert AFTER INSERT ON results BEGIN
	INSERT INTO stat_cells VALUES (new.partition, new.lane, 1, new.finish_reason = 'length', new.rule <> '',
		new.reasoning_tokens > 0, new.end_reason <> '', new.prompt_tokens, new.completion_tokens, new.reasoning_tokens)
	ON CONFLICT (partition, lane) DO UPDATE SET requests = requests + 1, truncated = truncated + excluded.truncated,
		rejected = rejected + excluded.rejected, with_reasoning = with_reasoning + excluded.with_reasoning,
		ended = ended + excluded.ended, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
		completion_tokens = completion_tokens + excluded.completion_tokens, reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens;
	INSERT INTO stat_tokens VALUES (new.partition, new.lane, 'prompt', new.prompt_tokens, 1)
	ON CONFLICT (partition, lane, kind, tokens) DO UPDATE SET n = n + 1;
	INSERT INTO stat_tokens VALUES (new.partition, new.lane, 'completion', new.completion_tokens, 1)
	ON CONFLICT (partition, lane, kind, tokens) DO UPDATE SET n = n + 1;
	INSERT INTO stat_minutes VALUES (new.finished_at / 60000000000, 1, new.prompt_tokens, new.completion_tokens)
	ON CONFLICT (minute) DO UPDATE SET requests = requests + 1, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
		completion_tokens = completion_tokens + excluded.completion_tokens;
	INSERT INTO stat_rejects SELECT new.partition, new.lane, new.rule, 1 WHERE new.rule <> ''
	ON CONFLICT (partition, lane, rule) DO UPDATE SET n = n + 1;
END;

-- A requeued reject leaves the dataset: its answer no longer counts (the
-- minute it was generated in keeps it: that work was done).
CREATE TRIGGER results_stats_delete AFTER DELETE ON results BEGIN
	UPDATE stat_cells SET requests = requests - 1, truncated = truncated - (old.finish_reason = 'length'),
		rejected = rejected - (old.rule <> ''), with_reasoning = with_reasoning - (old.reasoning_tokens > 0),
		ended = ended - (old.end_reason <> ''), prompt_tokens = prompt_tokens - old.prompt_tokens,
		completion_tokens = completion_tokens - old.completion_tokens, reasoning_tokens = reasoning_tokens - old.reasoning_tokens
	WHERE partition = old.partition AND lane = old.lane;
	UPDATE stat_tokens SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND kind = 'prompt' AND tokens = old.prompt_tokens;
	UPDATE stat_tokens SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND kind = 'completion' AND tokens = old.completion_tokens;
	UPDATE stat_rejects SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND rule = old.rule;
END;

CREATE TRIGGER turns_stats_insert AFTER INSERT ON turns BEGIN
	INSERT INTO stat_cells VALUES (new.partition, new.lane, 1, new.finish_reason = 'length', 0,
		new.reasoning_tokens > 0, 0, new.prompt_tokens, new.completion_tokens, new.reasoning_tokens)
	ON CONFLICT (partition, lane) DO UPDATE SET requests = requests + 1, truncated = truncated + excluded.truncated,
		with_reasoning = with_reasoning + excluded.with_reasoning, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
		completion_tokens = completion_tokens + excluded.completion_tokens, reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens;
	INSERT INTO stat_tokens VALUES (new.partition, new.lane, 'prompt', new.prompt_tokens, 1)
	ON CONFLICT (partition, lane, kind, tokens) DO UPDATE SET n = n + 1;
	INSERT INTO stat_tokens VALUES (new.partition, new.lane, 'completion', new.completion_tokens, 1)
	ON CONFLICT (partition, lane, kind, tokens) DO UPDATE SET n = n + 1;
	INSERT INTO stat_minutes VALUES (new.finished_at / 60000000000, 1, new.prompt_tokens, new.completion_tokens)
	ON CONFLICT (minute) DO UPDATE SET requests = requests + 1, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
		completion_tokens = completion_tokens + excluded.completion_tokens;
END;

-- A row whose id another row already took does not become a sample; it
-- is recorded here, once per origin (re-reading the same row is no
-- duplicate). BEFORE INSERT runs before the id conflict is resolved.
CREATE TABLE ingest_duplicates (
	origin       TEXT    PRIMARY KEY,
	id           TEXT    NOT NULL,
	partition    TEXT    NOT NULL,
	first_origin TEXT    NOT NULL,
	same_content INTEGER NOT NULL,
	created_at   INTEGER NOT NULL
);
CREATE TRIGGER samples_duplicate BEFORE INSERT ON samples
WHEN EXISTS (SELECT 1 FROM samples WHERE id = new.id AND origin <> new.origin) BEGIN
	INSERT OR IGNORE INTO ingest_duplicates (origin, id, partition, first_origin, same_content, created_at)
	SELECT new.origin, new.id, new.partition, origin, body = new.body, new.created_at FROM samples WHERE id = new.id;
END;
`,
	// 2 -> 3: one heartbeat per worker, events tagged by worker, and the
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
	// 3 -> 4: a smaller row. A sample's origin ("file:line") keeps its file
	// in a table of its own (a job has few files and up to 10^7 rows);
	// created_at, never read, goes; and Ingest keeps the counts once per
	// batch instead of a trigger per row. The duplicate-id trigger reads
	// origins from the new columns.
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
DROP TRIGGER samples_duplicate;
ALTER TABLE samples DROP COLUMN origin;
ALTER TABLE samples DROP COLUMN created_at;
DROP TRIGGER samples_count_insert;

CREATE TRIGGER samples_duplicate BEFORE INSERT ON samples
WHEN EXISTS (SELECT 1 FROM samples WHERE id = new.id AND (origin_file <> new.origin_file OR origin_pos <> new.origin_pos)) BEGIN
	INSERT OR IGNORE INTO ingest_duplicates (origin, id, partition, first_origin, same_content, created_at)
	SELECT (SELECT prefix FROM origins WHERE id = new.origin_file) || new.origin_pos, new.id, new.partition,
		(SELECT prefix FROM origins WHERE id = s.origin_file) || s.origin_pos, s.body = new.body,
		CAST(unixepoch('subsec') * 1000000000 AS INTEGER)
	FROM samples s WHERE s.id = new.id;
END;
`,
	// 4 -> 5: dashboard history and the sample browser's listings.
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
	// 5 -> 6: configuration generations. Answers stored before are of
	// generation 1, which the first run adopts with its configuration.
	`
CREATE TABLE generations (
	generation   INTEGER PRIMARY KEY,
	fingerprint  TEXT    NOT NULL,
	config       BLOB    NOT NULL, -- canonical JSON
	served_model TEXT    NOT NULL DEFAULT '',
	started_at   INTEGER NOT NULL,
	requeued     INTEGER NOT NULL,
	superseded   INTEGER NOT NULL DEFAULT 0
);
ALTER TABLE results ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE turns ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;

-- The answers (and dead-letter reasons) a new generation took out of the
-- dataset: nothing is deleted. superseded_by is the generation that
-- requeued them; state is done, rejected, turn (an earlier turn's answer)
-- or dead.
CREATE TABLE answer_history (
	sample_id         TEXT    NOT NULL,
	superseded_by     INTEGER NOT NULL,
	turn              INTEGER NOT NULL,
	generation        INTEGER NOT NULL,
	state             TEXT    NOT NULL,
	partition         TEXT    NOT NULL,
	lane              TEXT    NOT NULL,
	response          BLOB    NOT NULL,
	finish_reason     TEXT    NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	reasoning_tokens  INTEGER NOT NULL,
	endpoint          TEXT    NOT NULL,
	duration_ns       INTEGER NOT NULL,
	ttft_ns           INTEGER NOT NULL,
	attempts          INTEGER NOT NULL,
	reason            TEXT    NOT NULL,
	rule              TEXT    NOT NULL,
	end_reason        TEXT    NOT NULL,
	finished_at       INTEGER NOT NULL,
	PRIMARY KEY (sample_id, superseded_by, turn)
);

-- An earlier turn's answer leaving the dataset no longer counts (results
-- have had this since schema 2; turns were never deleted before).
CREATE TRIGGER turns_stats_delete AFTER DELETE ON turns BEGIN
	UPDATE stat_cells SET requests = requests - 1, truncated = truncated - (old.finish_reason = 'length'),
		with_reasoning = with_reasoning - (old.reasoning_tokens > 0), prompt_tokens = prompt_tokens - old.prompt_tokens,
		completion_tokens = completion_tokens - old.completion_tokens, reasoning_tokens = reasoning_tokens - old.reasoning_tokens
	WHERE partition = old.partition AND lane = old.lane;
	UPDATE stat_tokens SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND kind = 'prompt' AND tokens = old.prompt_tokens;
	UPDATE stat_tokens SET n = n - 1 WHERE partition = old.partition AND lane = old.lane AND kind = 'completion' AND tokens = old.completion_tokens;
END;
`,
	// 6 -> 7: a conversation's next turn is claimed ahead of samples that
	// have not started, so it reaches the server while its prefix is cached.
	`
CREATE INDEX samples_next_turn ON samples (lane, seq) WHERE state = 'pending' AND not_before = 0 AND turn > 0;
`,
	// 7 -> 8: samples held back until ingest rebuilds their bodies under a
	// new configuration (not_before = -1, which no claim takes), and what
	// identifies the job the store belongs to.
	`
CREATE INDEX samples_stale ON samples (partition) WHERE not_before < 0;
CREATE TABLE store_meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
) WITHOUT ROWID;
`,
	// 8 -> 9: a bad row is one partition's: two sources reading one file
	// with different mappings each record the rows bad for them (a row bad
	// for both was recorded once, for the first to read it). SQLite cannot
	// drop a column's UNIQUE, so the table is copied.
	`
CREATE TABLE ingest_errors_9 (
	seq        INTEGER PRIMARY KEY,
	origin     TEXT    NOT NULL,
	partition  TEXT    NOT NULL,
	field      TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (origin, partition)
);
INSERT INTO ingest_errors_9 (seq, origin, partition, field, reason, created_at)
	SELECT seq, origin, partition, field, reason, created_at FROM ingest_errors;
DROP TABLE ingest_errors;
ALTER TABLE ingest_errors_9 RENAME TO ingest_errors;
`,
	// 9 -> 10: hidden-state capture. One row per capture key (a sample,
	// or one of its turn rows), claimed under a lease with a fencing token
	// and recorded once with its file; path is NULL until captured and
	// unique after, so no file is listed twice.
	`
CREATE TABLE captures (
	key         TEXT    PRIMARY KEY,
	sample_id   TEXT    NOT NULL,
	turn        INTEGER NOT NULL,
	state       TEXT    NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'dead')),
	owner       TEXT    NOT NULL DEFAULT '',
	lease_until INTEGER NOT NULL DEFAULT 0, -- unix ns
	token       INTEGER NOT NULL DEFAULT 0,
	attempts    INTEGER NOT NULL DEFAULT 0,
	last_error  TEXT    NOT NULL DEFAULT '',
	path        TEXT    UNIQUE,
	bytes       INTEGER NOT NULL DEFAULT 0,
	sha256      TEXT    NOT NULL DEFAULT '',
	tokens      INTEGER NOT NULL DEFAULT 0,
	layers      INTEGER NOT NULL DEFAULT 0,
	hidden      INTEGER NOT NULL DEFAULT 0,
	dtype       TEXT    NOT NULL DEFAULT '',
	captured_at INTEGER NOT NULL DEFAULT 0 -- unix ns
) WITHOUT ROWID;
-- CaptureCounts sums this covering index, never the rows.
CREATE INDEX captures_counts ON captures (state, bytes, tokens);
CREATE INDEX captures_leased ON captures (owner) WHERE state = 'leased';
CREATE INDEX captures_failed ON captures (key) WHERE attempts > 0 AND state <> 'done';
`,
	// 10 -> 11: the sha256 of the ids a capture sent, so a sample
	// generated again (other ids) is captured again; '' matches any.
	`
ALTER TABLE captures ADD COLUMN input_sha256 TEXT NOT NULL DEFAULT '';
`,
	// 11 -> 12: a sample's body in a table of its own, written at ingest and
	// when a new configuration rebuilds it. SQLite rewrites a whole record,
	// overflow pages included, on any UPDATE of the row, so with the body
	// inline every claim, lease extension and finish wrote the whole
	// conversation again (about 64 KB of WAL per 16k-token turn). The
	// duplicate-id check, which compared bodies, moves to Ingest.
	`
CREATE TABLE sample_bodies (
	seq  INTEGER PRIMARY KEY, -- samples.seq
	body BLOB    NOT NULL
);
INSERT INTO sample_bodies (seq, body) SELECT seq, body FROM samples;
DROP TRIGGER samples_duplicate;
ALTER TABLE samples DROP COLUMN body;
CREATE TRIGGER samples_body_delete AFTER DELETE ON samples BEGIN
	DELETE FROM sample_bodies WHERE seq = old.seq;
END;
`,
	// 12 -> 13: captures.server_path (schema_server_path.go).
	captureServerPathStep,
}

// migrate brings the file to schemaVersion in one transaction, so a crash
// mid-migration leaves the old version intact.
func migrate(ctx context.Context, db *sql.DB, path string) error {
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
	// Read the version again under the write lock: another process (regen
	// status beside a starting run) may have migrated the file meanwhile.
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > schemaVersion {
		return fmt.Errorf("schema version %d is newer than this binary's %d", v, schemaVersion)
	}
	if err := checkBodiesMove(ctx, tx, path, v); err != nil {
		return err
	}
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
