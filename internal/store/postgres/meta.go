package postgres

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/jackc/pgx/v5"
)

// Meta returns the value recorded under key.
func (s *Store) Meta(ctx context.Context, key string) (string, bool, error) {
	var v string
	err := s.pool.QueryRow(ctx, `SELECT value FROM store_meta WHERE key = $1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read store %s: %w", key, err)
	}
	return v, true, nil
}

// SetMeta records value under key (unless one is recorded and replace is
// false) and returns the value recorded now: the first of several workers
// recording at once wins, and the others read its value.
func (s *Store) SetMeta(ctx context.Context, key, value string, replace bool) (string, error) {
	q := `INSERT INTO store_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`
	if replace {
		q = `INSERT INTO store_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value`
	}
	if _, err := s.pool.Exec(ctx, q, key, text(value)); err != nil {
		return "", fmt.Errorf("record store %s: %w", key, err)
	}
	got, ok, err := s.Meta(ctx, key)
	if err == nil && !ok {
		err = errors.New("not recorded")
	}
	if err != nil {
		return "", fmt.Errorf("record store %s: %w", key, err)
	}
	return got, nil
}

// OriginFiles lists the source files the store names: in origins (a
// prefix is "file:") and in the manifest.
func (s *Store) OriginFiles(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT left(prefix, -1) FROM origins UNION SELECT path FROM source_files ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list source files: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list source files: %w", err)
	}
	return out, nil
}

// relocateSQL strips folder $1 (ending in a separator) from one column,
// leaving a name already taken in its relative form.
var relocateSQL = []string{
	`UPDATE origins o SET prefix = substr(o.prefix, length($1) + 1) WHERE starts_with(o.prefix, $1)
		AND NOT EXISTS (SELECT 1 FROM origins x WHERE x.prefix = substr(o.prefix, length($1) + 1))`,
	`UPDATE source_files f SET path = substr(f.path, length($1) + 1) WHERE starts_with(f.path, $1)
		AND NOT EXISTS (SELECT 1 FROM source_files x WHERE x.partition = f.partition AND x.path = substr(f.path, length($1) + 1))`,
	`UPDATE ingest_errors e SET origin = substr(e.origin, length($1) + 1) WHERE starts_with(e.origin, $1)
		AND NOT EXISTS (SELECT 1 FROM ingest_errors x WHERE x.origin = substr(e.origin, length($1) + 1))`,
	`UPDATE ingest_duplicates d SET origin = substr(d.origin, length($1) + 1) WHERE starts_with(d.origin, $1)
		AND NOT EXISTS (SELECT 1 FROM ingest_duplicates x WHERE x.origin = substr(d.origin, length($1) + 1))`,
	`UPDATE ingest_duplicates SET first_origin = substr(first_origin, length($1) + 1) WHERE starts_with(first_origin, $1)`,
}

// Relocate names the files under folder from (stored absolute by an
// earlier regen) relative to it, in one transaction, and reports how many
// names changed.
func (s *Store) Relocate(ctx context.Context, from string) (int, error) {
	prefix := text(from + string(filepath.Separator))
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, q := range relocateSQL {
			tag, err := tx.Exec(ctx, q, prefix)
			if err != nil {
				return err
			}
			n += int(tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("name the files under %s relative to it: %w", from, err)
	}
	s.mu.Lock()
	clear(s.origins) // ids now stand for other names
	s.mu.Unlock()
	return n, nil
}
