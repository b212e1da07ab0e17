// Package sqlite is the embedded store.Store backend: one SQLite file per
// job, opened through the pure-Go modernc.org/sqlite driver (driver name
// "sqlite"), so the binary stays static.
//
// Durability. The file runs in WAL mode with synchronous=NORMAL. A commit
// appends to the write-ahead log and returns without waiting for fsync; the
// log is fsynced at checkpoints. So a crash of the process (kill -9, panic,
// OOM kill) loses nothing that was committed: the log is in the operating
// system's page cache and is replayed on the next Open. A power loss or
// kernel crash can lose the last commits made since the previous checkpoint,
// but never corrupts the file or splits a transaction: a result and its
// sample's state change are both there or both gone. That trade keeps a
// commit at tens of microseconds instead of an fsync per sample; for a job
// store whose lost commits are simply redone (the samples come back as
// pending), it is the right one.
//
// Concurrency. Every statement goes through one connection, which
// serialises writers in-process without SQLITE_BUSY. Write transactions
// begin IMMEDIATE and busy_timeout (5 s by default) makes another process
// (a second runner, `regen status`) wait for the lock instead of failing.
// Claim is a single UPDATE ... WHERE seq IN (SELECT ... LIMIT n) RETURNING,
// so no two claimers can receive the same sample. Finished reads in pages
// of 1000 rows by keyset (id > last) and holds no connection while its
// callback runs, so an export never blocks the dispatcher for long and the
// callback may call the store.
//
// State machine. Samples are ordered by an integer seq assigned at ingest;
// Claim hands out the oldest due sample first (state pending, the lane
// asked for, not_before <= now). Every transition that needs a lease checks
// state = leased and lease_owner in the same UPDATE and returns
// store.ErrNotLeased when it matched nothing, changing nothing. Complete,
// Reject, Retry and DeadLetter spend one attempt; Release, ReleaseOwner,
// Escalate and ExpireLeases never do. Complete and Reject write the result
// row and the state change in one transaction; results has the sample id as
// its primary key, so a sample can never have two. Dead samples have no
// result row; their reason is the sample's last error.
//
// Schema. The schema version lives in PRAGMA user_version and is migrated
// forward in one transaction at Open; a file from a newer binary is
// refused. Per-(partition, lane, state) counts are kept by triggers in a
// small table, so Counts costs the same at 10^7 samples as at 10; partial
// indexes cover the pending queue, the leased set, finished samples in id
// order and recent errors. A sample's body lives in sample_bodies, apart
// from the row every state change rewrites.
//
// Time comes from Options.Now (time.Now by default) and is stored as unix
// nanoseconds; tests inject a clock to control lease expiry and retry times.
package sqlite
