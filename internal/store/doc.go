// Package store owns the durable sample state machine: every sample is
// pending, leased, done, rejected or dead, and every transition happens in one
// transaction together with the data it records (a result is stored in the
// same transaction that marks its sample done).
//
// The store is offered in roles, and each consumer takes the narrowest
// one it uses:
//
//	Queue          claim, extend, Commit a typed Transition, release,
//	               expire, counts, requeue dead          dispatch
//	Outcomes       Commit's token-less shorthands        tools, tests
//	Requeue        a dead worker's leases, regen requeue runner, cmd
//	Intake         ingest, bad rows, the file manifest   runner (ingest)
//	Journal        heartbeats, events, minutes, locks    runner; monitor and
//	               (JournalReader: the reads)            web read
//	Configs        configuration generations             runner
//	Reader         Progress (headline numbers),          stats, monitor,
//	               Statistics (dataset sums), Browse     export, web
//	               (listings), Dataset (whole-job walks)
//	Captures       hidden-state files: claim, record     capture; views,
//	               once, count, list                     export, verify
//
// Store is their union. Backends (sqlite, postgres) implement Store and
// must pass the shared conformance suite in storetest; a fake that stands
// in for one role passes the part of the suite for that role
// (storetest.RunQueue for a Queue).
//
// The store never decides policy (retries, lanes, escalation); the dispatcher
// does, and tells the store what happened.
package store
