package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/groupcommit"
)

// Options tunes a Store.
type Options struct {
	// Schema is the job's namespace in the database; required. Two jobs
	// sharing a database never see each other's rows.
	Schema string
	// Now is the clock for leases, retry times and finish stamps; nil means
	// time.Now.
	Now func() time.Time
	// MaxConns caps the pool; zero means 8. Locks use connections of their
	// own, outside the pool.
	MaxConns int32
	// NoCreate makes Open fail with store.ErrNoStore instead of creating a
	// missing schema (for commands that only read a job).
	NoCreate bool
	// CommitBatch caps how many lease transitions share one transaction
	// (group commit); zero means 256, 1 means a transaction each (for
	// measuring what group commit buys).
	CommitBatch int
	// targetVersion migrates only up to this version (tests of upgrades);
	// zero means schemaVersion.
	targetVersion int
}

// Store is the PostgreSQL implementation of store.Store.
type Store struct {
	pool              *pgxpool.Pool
	connCfg           *pgx.ConnConfig // for lock connections
	schema            string
	location          string
	now               func() time.Time
	store.Transitions // Complete, Reject, ... queued for commitBatch

	mu      sync.Mutex
	origins map[string]int32 // origin file prefix -> origins.id, committed rows only
}

var _ store.Store = (*Store)(nil)

// commitTimeout bounds one group commit, so a server that stops answering
// (rather than refusing) turns into an error the caller can retry.
const commitTimeout = 30 * time.Second

// Open connects to the database at dsn and brings the schema o.Schema to
// the current version, creating it unless o.NoCreate.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	loc := Redact(dsn)
	if err := checkSchemaName(o.Schema); err != nil {
		return nil, fmt.Errorf("open store %s: %w", loc, err)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 8
	}
	target := schemaVersion
	if o.targetVersion > 0 {
		target = o.targetVersion
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", loc, redactErr(err, dsn))
	}
	cfg.MaxConns = o.MaxConns
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	cfg.ConnConfig.DialFunc = dialer(cfg.ConnConfig.ConnectTimeout).DialContext
	cfg.ConnConfig.RuntimeParams["search_path"] = o.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = "regen"
	// Only results wait for the WAL to reach the disk (commitTx turns it
	// back on); see the package doc for why the rest may commit lazily.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"

	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", loc, redactErr(err, dsn))
	}
	err = migrate(ctx, conn, o.Schema, target, !o.NoCreate)
	conn.Close(ctx)
	if errors.Is(err, errNoSchema) {
		return nil, fmt.Errorf("open store %s schema %s: %w", loc, o.Schema, store.ErrNoStore)
	}
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", loc, err)
	}

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", loc, redactErr(err, dsn))
	}
	s := &Store{pool: pool, connCfg: cfg.ConnConfig, schema: o.Schema, location: loc + " schema " + o.Schema, now: o.Now,
		origins: map[string]int32{}}
	s.Commits = groupcommit.New(o.CommitBatch, s.commitBatch)
	return s, nil
}

// Close commits what is queued and closes the pool.
func (s *Store) Close() error {
	s.Commits.Close()
	s.pool.Close()
	return nil
}

// Info describes the store: shared, with a redacted location.
func (s *Store) Info() store.Info {
	return store.Info{Backend: "postgres", Location: s.location, Shared: true}
}

// Pool exposes the pool for tests and diagnostics. Writes through it bypass
// the state machine.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

var schemaNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func checkSchemaName(name string) error {
	if !schemaNameRE.MatchString(name) {
		return fmt.Errorf("schema name %q: want 1-63 lowercase letters, digits and underscores, not starting with a digit", name)
	}
	return nil
}

// SchemaFor turns a job name into a schema name: "regen_" and the name in
// lowercase with every other character as "_", cut to PostgreSQL's 63
// bytes with a hash of the full name when it is longer.
func SchemaFor(job string) string {
	var b strings.Builder
	b.WriteString("regen_")
	for _, r := range strings.ToLower(job) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 63 {
		h := fnv.New32a()
		h.Write([]byte(job))
		s = fmt.Sprintf("%s_%08x", s[:54], h.Sum32())
	}
	return s
}

var kvPasswordRE = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// Redact returns dsn without its password (in the URL's user part, a
// password query parameter, or a key=value password), for messages and logs.
func Redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
		}
		q := u.Query()
		for k := range q {
			if strings.EqualFold(k, "password") {
				q.Set(k, "xxxxx")
			}
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	return kvPasswordRE.ReplaceAllString(dsn, "${1}xxxxx")
}

// redactErr strips the DSN's password from an error's text, in case a
// driver message quotes it.
func redactErr(err error, dsn string) error {
	pw := passwordOf(dsn)
	if pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}

func passwordOf(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				return p
			}
		}
		return u.Query().Get("password")
	}
	if m := kvPasswordRE.FindStringSubmatch(dsn); m != nil {
		return strings.Trim(m[2], "'")
	}
	return ""
}

// lockKey maps a lock name in a schema to a 64-bit advisory lock key.
func lockKey(schema, name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// TryLock takes a session advisory lock on a connection of its own, held
// until unlock (or until the connection dies, with its holder).
func (s *Store) TryLock(ctx context.Context, name string) (func() error, bool, error) {
	conn, err := pgx.ConnectConfig(ctx, s.connCfg)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	key := lockKey(s.schema, name)
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		conn.Close(context.Background())
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	if !ok {
		conn.Close(context.Background())
		return nil, false, nil
	}
	unlock := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Closing the session releases the lock too; unlock first so the
		// release does not wait for the server to notice the disconnect.
		_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key)
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("unlock %s: %w", name, err)
		}
		return nil
	}
	return unlock, true, nil
}

// text makes a free-text value storable: PostgreSQL text holds neither NUL
// bytes nor invalid UTF-8, which server messages may carry.
func text(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// bytes keeps a nil slice out of NOT NULL bytea columns.
func nonNil(b []byte) []byte {
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

// ns stores a time as unix nanoseconds, the zero time as 0.
func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v)
}

// statementError reports whether err came from the server about a
// statement (bad data, a constraint), as opposed to the connection: only
// those are worth retrying one request at a time.
func statementError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}
