package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
)

// Meta returns the value recorded under key.
func (s *Store) Meta(ctx context.Context, key string) (string, bool, error) {
	var v string
	st, err := s.stmt(ctx, `SELECT value FROM store_meta WHERE key = ?`)
	if err == nil {
		err = st.QueryRowContext(ctx, key).Scan(&v)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read store %s: %w", key, err)
	}
	return v, true, nil
}

// SetMeta records value under key (unless one is recorded and replace is
// false) and returns the value recorded now, in one transaction.
func (s *Store) SetMeta(ctx context.Context, key, value string, replace bool) (string, error) {
	var got string
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		q := `INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`
		if replace {
			q = `INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`
		}
		if _, err := tx.ExecContext(ctx, q, key, value); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT value FROM store_meta WHERE key = ?`, key).Scan(&got)
	})
	if err != nil {
		return "", fmt.Errorf("record store %s: %w", key, err)
	}
	return got, nil
}

// OriginFiles lists the source files the store names: in origins (a
// prefix is "file:") and in the manifest.
func (s *Store) OriginFiles(ctx context.Context) ([]string, error) {
	rows, err := s.query(ctx, `SELECT substr(prefix, 1, length(prefix) - 1) FROM origins
		UNION SELECT path FROM source_files ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list source files: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var f string
		if err := rows.Scan(&f); err != nil {
			return nil, fmt.Errorf("list source files: %w", err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list source files: %w", err)
	}
	return out, nil
}

// relocateSQL strips folder ?1 (ending in a separator) from one column;
// substr and length count characters, alike. A name already taken in its
// relative form is left (OR IGNORE).
var relocateSQL = []string{
	`UPDATE OR IGNORE origins SET prefix = substr(prefix, length(?1) + 1) WHERE substr(prefix, 1, length(?1)) = ?1`,
	`UPDATE OR IGNORE source_files SET path = substr(path, length(?1) + 1) WHERE substr(path, 1, length(?1)) = ?1`,
	`UPDATE OR IGNORE ingest_errors SET origin = substr(origin, length(?1) + 1) WHERE substr(origin, 1, length(?1)) = ?1`,
	`UPDATE OR IGNORE ingest_duplicates SET origin = substr(origin, length(?1) + 1) WHERE substr(origin, 1, length(?1)) = ?1`,
	`UPDATE ingest_duplicates SET first_origin = substr(first_origin, length(?1) + 1) WHERE substr(first_origin, 1, length(?1)) = ?1`,
}

// Relocate names the files under folder from (stored absolute by an
// earlier regen) relative to it, in one transaction, and reports how many
// names changed.
func (s *Store) Relocate(ctx context.Context, from string) (int, error) {
	prefix := from + string(filepath.Separator)
	n := 0
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for _, q := range relocateSQL {
			res, err := tx.ExecContext(ctx, q, prefix)
			if err != nil {
				return err
			}
			k, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += int(k)
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
