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
// it matched nothing. ExpireLeases returns expired leases to pending; the
// workers call it periodically, so a dead worker's samples come back within
// its lease.
//
// Group commit. Complete, Reject, Retry, DeadLetter and Escalate go through
// a groupcommit.Queue: requests that arrive while a commit is running are
// committed together in the next transaction (finished samples and their
// results in one statement over arrays), and each caller returns only once
// its own change has committed. A transaction that fails on one request's
// data is retried one request per transaction, so a bad request fails
// alone.
//
// Counts. Per-(partition, lane, state) counts are maintained by
// statement-level triggers with transition tables, into rows sharded by the
// writing backend's pid: concurrent workers do not queue on one hot counter
// row, and Counts sums a small table instead of scanning the samples.
//
// Ingest inserts a batch as one INSERT ... SELECT FROM unnest(...) ON
// CONFLICT (id) DO NOTHING, so every worker may ingest the same files and
// each sample is stored once.
//
// Schema. regen creates and migrates its schema itself, under an advisory
// lock (so workers starting together migrate once), and records the version
// in regen_schema; a schema written by a newer regen is refused with a
// message saying so.
//
// Locks. TryLock is pg_try_advisory_lock on a connection of its own, held
// until unlock; a worker that dies drops its connection and so its locks.
//
// Passwords come from PGPASSWORD or a PGPASSFILE (pgx reads both), or from
// the DSN; Redact removes them from a DSN before it is shown anywhere.
package postgres
