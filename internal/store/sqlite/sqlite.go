package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	sqlitedriver "modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/groupcommit"
)

// Options tunes a Store. The zero value is ready to use.
type Options struct {
	// Now is the clock for leases, retry times and finish stamps. Tests set
	// it to control lease expiry; nil means time.Now.
	Now func() time.Time
	// BusyTimeout is how long a statement waits for another process's lock
	// before failing with SQLITE_BUSY; zero means 5 s.
	BusyTimeout time.Duration
	// CommitBatch caps how many lease transitions share one transaction
	// (group commit); zero means 256, 1 means a transaction each (for
	// measuring what group commit buys).
	CommitBatch int
}

// Store is the SQLite implementation of store.Store.
type Store struct {
	db                *sql.DB
	now               func() time.Time
	path              string
	lockDir           string
	store.Transitions // Complete, Reject, ... queued for commitBatch

	mu      sync.Mutex
	stmts   map[string]*sql.Stmt // prepared once: parsing is a sixth of a commit's CPU
	origins map[string]int64     // origin file prefix -> origins.id, committed rows only
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the store file at path with default Options.
func Open(path string) (*Store, error) {
	return OpenWith(path, Options{})
}

// OpenWith opens (creating if needed) the store file at path and brings its
// schema to the current version.
func OpenWith(path string, o Options) (*Store, error) {
	if path == "" {
		return nil, errors.New("open store: empty path")
	}
	if strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("open store %s: path must not contain '?'", path)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", o.BusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	// Writers take the lock at BEGIN, so a second process waits on
	// busy_timeout instead of failing a read-to-write upgrade.
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// SQLite has one writer; one connection serialises writers in-process
	// without SQLITE_BUSY and keeps prepared statements warm.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)

	ctx := context.Background()
	var mode string
	// The first connection to a new file switches it to WAL, which SQLite
	// refuses at once (no busy wait) while another process is doing the
	// same: regen status beside a run creating its store. Retry until the
	// busy timeout; the connection that failed is not kept.
	for deadline := time.Now().Add(o.BusyTimeout); ; {
		err = db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
		if err == nil || !busy(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("open store %s: journal mode is %q, want wal", path, mode)
	}
	if err := migrate(ctx, db, path); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	s := &Store{db: db, now: o.Now, path: path, lockDir: path + ".locks", stmts: map[string]*sql.Stmt{}, origins: map[string]int64{}}
	s.Commits = groupcommit.New(o.CommitBatch, s.commitBatch)
	for _, q := range txQueries {
		if _, err := s.stmt(ctx, q); err != nil {
			s.Close()
			return nil, fmt.Errorf("open store %s: prepare: %w", path, err)
		}
	}
	return s, nil
}

// Info describes the store: one file, one runner at a time.
func (s *Store) Info() store.Info {
	return store.Info{Backend: "sqlite", Location: s.path}
}

// Close commits what is queued, checkpoints the log into the main file and
// closes it.
func (s *Store) Close() error {
	s.Commits.Close()
	s.mu.Lock()
	for q, st := range s.stmts {
		st.Close()
		delete(s.stmts, q)
	}
	s.mu.Unlock()
	// optimize refreshes planner statistics cheaply; a failure is harmless.
	_, _ = s.db.Exec("PRAGMA optimize")
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close store %s: %w", s.path, err)
	}
	return nil
}

// DB exposes the underlying handle for tests and diagnostics (integrity
// checks, query plans). Writes through it bypass the state machine.
func (s *Store) DB() *sql.DB { return s.db }

// ns stores a time as unix nanoseconds, the zero time as 0.
func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromNS is the inverse of ns.
func fromNS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v)
}

// blob keeps nil and empty apart from NOT NULL: both are stored as an empty
// blob and read back as nil.
func blob(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func unblob(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// inTx runs fn in one write transaction and commits it if fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// stmt returns the statement for query, preparing it on first use.
func (s *Store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	s.mu.Lock()
	st, ok := s.stmts[query]
	s.mu.Unlock()
	if ok {
		return st, nil
	}
	// Prepare without holding mu: it waits for the single connection, and a
	// transaction holding that connection may need mu (txStmt) to finish.
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.stmts[query]; ok {
		st.Close()
		return prev, nil
	}
	s.stmts[query] = st
	return st, nil
}

// exec runs a prepared query, in tx when tx is not nil.
func (s *Store) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	if tx != nil {
		st, err := s.txStmt(ctx, tx, query)
		if err != nil {
			return nil, err
		}
		return st.ExecContext(ctx, args...)
	}
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// query runs a prepared query outside any transaction.
func (s *Store) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// txStmt returns query's statement, prepared at Open, bound to tx. A query
// not in txQueries is an error rather than a prepare, which would wait
// forever for the connection tx holds.
func (s *Store) txStmt(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	s.mu.Lock()
	st, ok := s.stmts[query]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("statement used in a transaction is not in txQueries")
	}
	return tx.StmtContext(ctx, st), nil
}

// busy reports whether err is SQLite's "database is locked".
func busy(err error) bool {
	var se *sqlitedriver.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}
