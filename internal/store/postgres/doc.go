// Package postgres is the shared store.Store backend: one PostgreSQL
// database, any number of regen workers on any number of hosts, each job in
// a schema of its own (Options.Schema), through jackc/pgx/v5's pool with its
// per-connection statement cache (every query is prepared once per
// connection).
//
// Leases. Claim is one statement: two CTEs pick the oldest due samples of a
// lane from partial indexes (never told to wait; waiting for a retry time
// that has come) with FOR UPDATE SKIP LOCKED, so concurrent claimers on
// many hosts skip each other's rows instead of waiting or colliding, and an
// UPDATE leases what they picked. Every transition that needs a lease checks
// state and lease_owner in its own UPDATE and reports store.ErrNotLeased when
// it matched nothing. Each claim also gives the row a fencing token from a
// sequence (Claimed.Token); a transition that carries it (Commit, as the
// dispatcher's do) takes only under that very lease, so the answer of a
// worker that froze past its lease is refused even if that worker has
// claimed the sample again since. ExpireLeases returns expired leases to pending; the
// workers call it periodically, so a dead worker's samples come back within
// its lease.
//
// Group commit. Complete, CompleteTurn, Reject, Retry, DeadLetter and
// Escalate go through a groupcommit.Queue: requests that arrive while a
// commit is running are committed together in the next transaction
// (finished samples and their results in one statement over arrays; the
// whole transaction one pipelined round trip), and each caller returns only
// once its own change has committed. A transaction that fails on one
// request's data is retried one request per transaction, so a bad request
// fails alone.
//
// Durability. These commits wait for the WAL to reach the disk
// (synchronous_commit on): a result counts once it is durable. Everything
// else (claims, lease extensions and releases, heartbeats, events, ingest)
// commits without waiting: a crash of the database may undo its last
// fraction of a second, which costs only repeated work: an undone claim
// leaves a sample pending that its worker then cannot complete, an undone
// ingest batch is read again (its file is not marked complete), and an
// undone release is found by the dispatcher, which after any store failure
// returns every sample leased to it that it does not hold.
//
// Counts and statistics. Per-(partition, lane, state) counts, and the
// dataset statistics of stored answers, move in the statement that changes
// the samples (a CTE per statement, see counts.go and stats.go), into rows
// sharded by the writing backend's pid: concurrent workers do not queue on
// one hot row, and readers sum a small table instead of scanning samples.
//
// Ingest inserts a batch as one INSERT ... SELECT FROM unnest(...) ON
// CONFLICT (id) DO NOTHING, so every worker may ingest the same files and
// each sample is stored once (a row whose id another row took is recorded
// as a duplicate). A sample's origin keeps its file part in a table of its
// own.
//
// Schema. regen creates and migrates its schema itself, under an advisory
// lock (so workers starting together migrate once), and records the version
// in regen_schema; a schema written by a newer regen is refused with a
// message saying so.
//
// History and browsing. Each worker upserts its own per-minute rows
// (minutes, keyed by minute, worker and endpoint) once per heartbeat, so
// workers never write the same row and the views sum them. The sample
// browser pages by id: dead letters and rejects through partial indexes on
// their rare states, done samples through samples_finished, everything else
// along the id index (an index on partition would cost every claim and
// completion an index entry, since each writes a new row version).
//
// Locks. TryLock is pg_try_advisory_lock on a connection of its own, held
// until unlock; a worker that dies drops its connection and so its locks.
//
// Passwords come from PGPASSWORD or a PGPASSFILE (pgx reads both), or from
// the DSN; Redact removes them from a DSN before it is shown anywhere.
package postgres
