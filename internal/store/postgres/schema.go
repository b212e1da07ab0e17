package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// schemaVersion is the version this binary writes. Add a step to
// migrations and bump it when the schema changes; a schema written by a
// newer binary is refused rather than guessed at.
const schemaVersion = 11

// migrations[i] takes a schema from version i to i+1. Every statement runs
// with search_path set to the job's schema.
var migrations = []string{
	// 0 -> 1: samples, results, errors, heartbeats, events, counts.
	`
CREATE TABLE samples (
	seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- ingest order
	id            text COLLATE "C" NOT NULL UNIQUE,
	partition     text NOT NULL,
	lane          text NOT NULL,
	state         smallint NOT NULL CHECK (state BETWEEN 0 AND 4),
	turn          integer NOT NULL DEFAULT 0, -- the next turn to generate
	attempts      integer NOT NULL DEFAULT 0, -- on this turn
	prompt_tokens integer NOT NULL,
	not_before    bigint NOT NULL DEFAULT 0, -- unix ns
	lease_until   bigint,
	lease_owner   text,
	last_error_at bigint,
	finished_at   bigint, -- set exactly when state is done, rejected or dead
	last_error    text,
	origin_file   integer NOT NULL, -- origins.id: a job has few files and up to 10^7 rows
	origin_pos    text NOT NULL,    -- the rest of the origin: a line, "row N"
	body          bytea NOT NULL
);
CREATE TABLE origins (
	id     integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	prefix text NOT NULL UNIQUE -- an origin up to and including its last ':'
);
-- Claim reads two partial indexes: samples never told to wait, in ingest
-- order, and samples waiting for a retry time, so the ones not yet due are
-- never scanned however many there are.
CREATE INDEX samples_ready ON samples (lane, seq) WHERE state = 0 AND not_before = 0;
CREATE INDEX samples_waiting ON samples (lane, not_before, seq) WHERE state = 0 AND not_before > 0;
-- Leased rows are bounded by concurrency, not job size: one small index
-- serves the owner's extensions and releases and, read whole, the expiry
-- scan (one index entry fewer per claim than two indexes would cost).
CREATE INDEX samples_leased ON samples (lease_owner, lease_until) WHERE state = 1;
CREATE INDEX samples_finished ON samples (id) WHERE finished_at IS NOT NULL;
CREATE INDEX samples_errors ON samples (last_error_at, seq) WHERE last_error_at IS NOT NULL;
CREATE INDEX samples_dead ON samples (seq) WHERE state = 4;

-- One result per sample (its last turn's answer): the primary key is the
-- exactly-once guarantee.
CREATE TABLE results (
	sample_id         text COLLATE "C" PRIMARY KEY,
	finished_at       bigint NOT NULL,
	duration_ns       bigint NOT NULL,
	ttft_ns           bigint NOT NULL,
	turn              integer NOT NULL,
	prompt_tokens     integer NOT NULL,
	completion_tokens integer NOT NULL,
	reasoning_tokens  integer NOT NULL,
	partition         text NOT NULL,
	lane              text NOT NULL,
	finish_reason     text NOT NULL,
	endpoint          text NOT NULL,
	reason            text NOT NULL DEFAULT '', -- reject evidence, '' when done
	rule              text NOT NULL DEFAULT '', -- the quality rule of a reject
	end_reason        text NOT NULL DEFAULT '',
	response          bytea NOT NULL
);
-- Covering, so ThroughputSince never reads the responses.
CREATE INDEX results_finished_at ON results (finished_at) INCLUDE (prompt_tokens, completion_tokens);
CREATE INDEX results_rule ON results (rule) WHERE rule <> '';

-- The answers to every turn of a multi-turn sample but its last (which is
-- in results). The primary key is the exactly-once guarantee per turn.
CREATE TABLE turns (
	sample_id         text COLLATE "C" NOT NULL,
	turn              integer NOT NULL,
	finished_at       bigint NOT NULL,
	duration_ns       bigint NOT NULL,
	ttft_ns           bigint NOT NULL,
	prompt_tokens     integer NOT NULL,
	completion_tokens integer NOT NULL,
	reasoning_tokens  integer NOT NULL,
	attempts          integer NOT NULL,
	partition         text NOT NULL,
	lane              text NOT NULL,
	finish_reason     text NOT NULL,
	endpoint          text NOT NULL,
	response          bytea NOT NULL,
	PRIMARY KEY (sample_id, turn)
);
CREATE INDEX turns_finished_at ON turns (finished_at) INCLUDE (prompt_tokens, completion_tokens);

-- Statistics, moved by the statements that store or drop answers (see
-- stats.go), so regen stats reads a few thousand rows whatever the job
-- size. Every table is sharded like counts; readers sum the shards.
CREATE TABLE stat_cells (
	partition         text NOT NULL,
	lane              text NOT NULL,
	shard             smallint NOT NULL,
	requests          bigint NOT NULL,
	truncated         bigint NOT NULL,
	rejected          bigint NOT NULL,
	with_reasoning    bigint NOT NULL,
	ended             bigint NOT NULL,
	prompt_tokens     bigint NOT NULL,
	completion_tokens bigint NOT NULL,
	reasoning_tokens  bigint NOT NULL,
	PRIMARY KEY (partition, lane, shard)
);
-- One row per distinct token count, so percentiles are exact.
CREATE TABLE stat_tokens (
	partition text NOT NULL,
	lane      text NOT NULL,
	kind      text COLLATE "C" NOT NULL CHECK (kind IN ('prompt', 'completion')),
	tokens    integer NOT NULL,
	shard     smallint NOT NULL,
	n         bigint NOT NULL,
	PRIMARY KEY (partition, lane, kind, tokens, shard)
);
CREATE TABLE stat_minutes (
	minute            bigint NOT NULL, -- unix minutes
	shard             smallint NOT NULL,
	requests          bigint NOT NULL,
	prompt_tokens     bigint NOT NULL,
	completion_tokens bigint NOT NULL,
	PRIMARY KEY (minute, shard)
);
CREATE TABLE stat_rejects (
	partition text NOT NULL,
	lane      text NOT NULL,
	rule      text NOT NULL,
	shard     smallint NOT NULL,
	n         bigint NOT NULL,
	PRIMARY KEY (partition, lane, rule, shard)
);

-- A row whose id another row already took does not become a sample; it is
-- recorded here, once per origin (re-reading the same row is no duplicate).
CREATE TABLE ingest_duplicates (
	origin       text COLLATE "C" PRIMARY KEY,
	id           text NOT NULL,
	partition    text NOT NULL,
	first_origin text NOT NULL,
	same_content boolean NOT NULL,
	created_at   bigint NOT NULL
);

CREATE TABLE ingest_errors (
	seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	origin     text COLLATE "C" NOT NULL UNIQUE,
	partition  text NOT NULL,
	field      text NOT NULL,
	reason     text NOT NULL,
	created_at bigint NOT NULL
);

CREATE TABLE heartbeats (
	owner    text PRIMARY KEY,
	pid      integer NOT NULL,
	host     text NOT NULL,
	time     bigint NOT NULL,
	started  bigint NOT NULL,
	counters bytea NOT NULL
);
CREATE INDEX heartbeats_time ON heartbeats (time);

CREATE TABLE events (
	id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	time     bigint NOT NULL,
	kind     text NOT NULL,
	subject  text NOT NULL,
	state    text NOT NULL,
	evidence text NOT NULL,
	worker   text NOT NULL DEFAULT ''
);

-- counts is kept by the statements that change samples, in the same
-- statement (see counts.go). Rows are sharded by the writing backend, so
-- concurrent workers never queue on one hot row; Counts sums the shards.
CREATE TABLE counts (
	partition text NOT NULL,
	lane      text NOT NULL,
	state     smallint NOT NULL,
	shard     smallint NOT NULL,
	n         bigint NOT NULL,
	PRIMARY KEY (partition, lane, state, shard)
);
`,
	// 1 -> 2: the ingest manifest, so a re-run skips files already ingested.
	`
CREATE TABLE source_files (
	partition   text NOT NULL,
	path        text NOT NULL,
	size        bigint NOT NULL,
	mod_time    bigint NOT NULL,
	fingerprint text NOT NULL,
	rows        bigint NOT NULL,
	bad         bigint NOT NULL,
	complete    boolean NOT NULL,
	updated_at  bigint NOT NULL,
	PRIMARY KEY (partition, path)
);
`,
	// 2 -> 3: dashboard history and the sample browser's listings.
	`
-- One row per minute, worker and endpoint ('' = the worker's totals): each
-- worker rewrites only its own rows, and the views sum over workers.
CREATE TABLE minutes (
	time      bigint NOT NULL, -- unix ns of the minute's start
	worker    text COLLATE "C" NOT NULL,
	endpoint  text COLLATE "C" NOT NULL,
	samples   bigint NOT NULL,
	tokens    bigint NOT NULL,
	requests  bigint NOT NULL,
	errors    bigint NOT NULL,
	in_flight integer NOT NULL,
	kv_usage  double precision NOT NULL,
	queued    double precision NOT NULL,
	running   double precision NOT NULL,
	lim       integer NOT NULL,
	PRIMARY KEY (time, worker, endpoint)
);

-- A page of dead letters or rejects in id order among millions of done
-- samples reads only the failed ones. Partial indexes on rare states cost
-- the hot transitions (claim, complete) nothing.
CREATE INDEX samples_dead_id ON samples (id) WHERE state = 4;
CREATE INDEX samples_rejected_id ON samples (id) WHERE state = 3;
`,
	// 3 -> 4: configuration generations. Answers stored before are of
	// generation 1, which the first run adopts with its configuration.
	`
CREATE TABLE generations (
	generation   integer PRIMARY KEY,
	fingerprint  text NOT NULL,
	config       bytea NOT NULL, -- canonical JSON
	served_model text NOT NULL DEFAULT '',
	started_at   bigint NOT NULL,
	requeued     bigint NOT NULL,
	superseded   bigint NOT NULL DEFAULT 0
);
ALTER TABLE results ADD COLUMN generation integer NOT NULL DEFAULT 1;
ALTER TABLE turns ADD COLUMN generation integer NOT NULL DEFAULT 1;

-- The answers (and dead-letter reasons) a new generation took out of the
-- dataset: nothing is deleted. superseded_by is the generation that
-- requeued them; state is done, rejected, turn (an earlier turn's answer)
-- or dead.
CREATE TABLE answer_history (
	sample_id         text COLLATE "C" NOT NULL,
	superseded_by     integer NOT NULL,
	turn              integer NOT NULL,
	generation        integer NOT NULL,
	state             text NOT NULL,
	partition         text NOT NULL,
	lane              text NOT NULL,
	response          bytea NOT NULL,
	finish_reason     text NOT NULL,
	prompt_tokens     integer NOT NULL,
	completion_tokens integer NOT NULL,
	reasoning_tokens  integer NOT NULL,
	endpoint          text NOT NULL,
	duration_ns       bigint NOT NULL,
	ttft_ns           bigint NOT NULL,
	attempts          integer NOT NULL,
	reason            text NOT NULL,
	rule              text NOT NULL,
	end_reason        text NOT NULL,
	finished_at       bigint NOT NULL,
	PRIMARY KEY (sample_id, superseded_by, turn)
);
`,
	// 4 -> 5: fencing tokens. Every claim gives the sample's lease a new
	// token and the transitions carrying one take only under that lease, so
	// an answer from a lease its worker lost is refused even after the same
	// worker claimed the sample again. Rows leased before keep NULL, which
	// only an unfenced transition (token 0) matches.
	`
CREATE SEQUENCE lease_tokens;
ALTER TABLE samples ADD COLUMN lease_token bigint;
`,
	// 5 -> 6: a conversation's next turn is claimed ahead of samples that
	// have not started, so it reaches the server while its prefix is cached.
	`
CREATE INDEX samples_next_turn ON samples (lane, seq) WHERE state = 0 AND not_before = 0 AND turn > 0;
`,
	// 6 -> 7: samples held back until ingest rebuilds their bodies under a
	// new configuration (not_before = -1, which no claim takes), and what
	// identifies the job the store belongs to.
	`
CREATE INDEX samples_stale ON samples (partition) WHERE not_before < 0;
CREATE TABLE store_meta (
	key   text PRIMARY KEY,
	value text NOT NULL
);
`,
	// 7 -> 8: a bad row is one partition's: two sources reading one file
	// with different mappings each record the rows bad for them (a row bad
	// for both was recorded once, for the first to read it).
	`
ALTER TABLE ingest_errors DROP CONSTRAINT ingest_errors_origin_key;
ALTER TABLE ingest_errors ADD UNIQUE (origin, partition);
`,
	// 8 -> 9: hidden-state capture. One row per capture key (a sample,
	// or one of its turn rows), claimed under a lease with a fencing token
	// and recorded once with its file; path is NULL until captured and
	// unique after, so no file is listed twice.
	`
CREATE TABLE captures (
	key         text COLLATE "C" PRIMARY KEY,
	sample_id   text COLLATE "C" NOT NULL,
	turn        integer  NOT NULL,
	state       text     NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'dead')),
	owner       text     NOT NULL DEFAULT '',
	lease_until bigint   NOT NULL DEFAULT 0, -- unix ns
	token       bigint   NOT NULL DEFAULT 0,
	attempts    integer  NOT NULL DEFAULT 0,
	last_error  text     NOT NULL DEFAULT '',
	path        text     UNIQUE,
	bytes       bigint   NOT NULL DEFAULT 0,
	sha256      text     NOT NULL DEFAULT '',
	tokens      integer  NOT NULL DEFAULT 0,
	layers      integer  NOT NULL DEFAULT 0,
	hidden      integer  NOT NULL DEFAULT 0,
	dtype       text     NOT NULL DEFAULT '',
	captured_at bigint   NOT NULL DEFAULT 0 -- unix ns
);
CREATE INDEX captures_counts ON captures (state) INCLUDE (bytes, tokens);
CREATE INDEX captures_leased ON captures (owner) WHERE state = 'leased';
CREATE INDEX captures_failed ON captures (key) WHERE attempts > 0 AND state <> 'done';
`,
	// 9 -> 10: the sha256 of the ids a capture sent, so a sample
	// generated again (other ids) is captured again; '' matches any.
	`
ALTER TABLE captures ADD COLUMN input_sha256 text NOT NULL DEFAULT '';
`,
	// 10 -> 11: captures.server_path (schema_server_path.go).
	captureServerPathStep,
}

// ErrNewerSchema is returned when the job's schema was written by a newer
// regen than this one.
var ErrNewerSchema = errors.New("store schema is newer than this regen")

// migrate creates the job's schema if needed and brings it to target in
// one transaction, under an advisory lock so that workers starting at once
// migrate it once. create=false refuses to create a missing schema.
func migrate(ctx context.Context, conn *pgx.Conn, schema string, target int, create bool) error {
	// A schema already at target needs no lock: N workers starting at once
	// would otherwise queue on it one after another (32 workers spent 24 ms
	// of database time per worker waiting there).
	if current, err := atVersion(ctx, conn, schema, target); err != nil || current {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(schema, "regen:migrate")); err != nil {
		return fmt.Errorf("lock schema for migration: %w", err)
	}
	v, exists, err := version(ctx, tx, schema)
	if err != nil {
		return err
	}
	if !exists && !create {
		return errNoSchema
	}
	if v > target {
		return fmt.Errorf("%w: schema %s is at version %d, this regen knows up to %d; upgrade regen to use this store",
			ErrNewerSchema, schema, v, target)
	}
	if v == target {
		return tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	// SET LOCAL: the search path reverts at commit, whatever the connection
	// had before.
	if _, err := tx.Exec(ctx, `SET LOCAL search_path TO `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("set search path: %w", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE TABLE regen_schema (version integer NOT NULL)`); err != nil {
			return fmt.Errorf("create version table: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO regen_schema (version) VALUES (0)`); err != nil {
			return fmt.Errorf("create version table: %w", err)
		}
	}
	for i := v; i < target; i++ {
		if _, err := tx.Exec(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migrate schema %s from version %d to %d: %w", schema, i, i+1, err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE regen_schema SET version = $1`, target); err != nil {
		return fmt.Errorf("set schema version: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}

// atVersion reports whether the schema exists at exactly target, without
// taking the migration lock; a newer schema is refused here too. It looks
// in the catalog tables rather than through to_regclass: a name lookup
// that finds nothing leaves a negative entry in the backend's catalog
// cache, which the advisory lock wait that follows does not clear, so the
// locked check would then miss a schema another worker created meanwhile.
func atVersion(ctx context.Context, conn *pgx.Conn, schema string, target int) (bool, error) {
	var exists bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'regen_schema')`, schema).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("look for schema %s: %w", schema, err)
	}
	if !exists {
		return false, nil
	}
	var v int
	if err := conn.QueryRow(ctx, `SELECT version FROM `+pgx.Identifier{schema, "regen_schema"}.Sanitize()).Scan(&v); err != nil {
		return false, fmt.Errorf("read schema version of %s: %w", schema, err)
	}
	if v > target {
		return false, fmt.Errorf("%w: schema %s is at version %d, this regen knows up to %d; upgrade regen to use this store",
			ErrNewerSchema, schema, v, target)
	}
	return v == target, nil
}

var errNoSchema = errors.New("no such store")

// version reads the schema's version; exists is false when the schema has
// no version table yet.
func version(ctx context.Context, tx pgx.Tx, schema string) (v int, exists bool, err error) {
	var reg *string
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1)::text`, pgx.Identifier{schema, "regen_schema"}.Sanitize()).Scan(&reg); err != nil {
		return 0, false, fmt.Errorf("look for schema %s: %w", schema, err)
	}
	if reg == nil {
		return 0, false, nil
	}
	if err := tx.QueryRow(ctx, `SELECT version FROM `+pgx.Identifier{schema, "regen_schema"}.Sanitize()).Scan(&v); err != nil {
		return 0, false, fmt.Errorf("read schema version of %s: %w", schema, err)
	}
	return v, true, nil
}
