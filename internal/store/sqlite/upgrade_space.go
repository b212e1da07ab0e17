package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// bodiesSchema is the schema whose step (11 -> 12) copies every sample's
// body into sample_bodies in one transaction: the log and the file grow by
// about the bodies' volume until it commits.
const bodiesSchema = 12

// freeSpace is the space available to this process on the file system
// holding dir (a variable so tests can play a nearly full disk).
var freeSpace = func(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// upgradeNotes receives the one line said when the body move runs.
var upgradeNotes io.Writer = os.Stderr

// checkBodiesMove refuses, before any change, to move the bodies of a
// store at version v (< bodiesSchema) whose folder has less than twice
// their volume free: a full disk mid-move rolls back cleanly, but leaves a
// store this binary cannot open. When there is room it says so in one line.
func checkBodiesMove(ctx context.Context, tx *sql.Tx, path string, v int) error {
	if v == 0 || v >= bodiesSchema {
		return nil // a new file, or bodies already in their own table
	}
	var bodies int64
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(sum(length(body)), 0) FROM samples`).Scan(&bodies); err != nil {
		return fmt.Errorf("measure sample bodies: %w", err)
	}
	free, err := freeSpace(filepath.Dir(path))
	if err != nil {
		return err
	}
	name, need := filepath.Base(path), 2*bodies
	if free < need {
		return fmt.Errorf("upgrading %s to schema %d moves %s of sample bodies and needs about %s free; its folder has %s",
			name, bodiesSchema, sizeText(bodies), sizeText(need), sizeText(free))
	}
	fmt.Fprintf(upgradeNotes, "regen: upgrading %s to schema %d: moving %s of sample bodies to their own table (its folder has %s free)\n",
		name, bodiesSchema, sizeText(bodies), sizeText(free))
	return nil
}

// sizeText is n bytes in decimal units, to one decimal place.
func sizeText(n int64) string {
	units := []string{"bytes", "kB", "MB", "GB", "TB", "PB"}
	f, i := float64(n), 0
	for f >= 1000 && i < len(units)-1 {
		f, i = f/1000, i+1
	}
	if i == 0 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
