package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"
)

// A statement prepared on first use while a transaction holds the single
// connection must not block that transaction's own prepared statements: the
// prepare waits for the connection, so it may not hold the statement lock.
func TestFirstUsePrepareDuringTransaction(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	reader := make(chan error, 1)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		go func() {
			_, err := s.Events(ctx, 5) // first use: prepares, waits for the connection
			reader <- err
		}()
		// Give the reader time to reach PrepareContext; the test is
		// meaningful only if it gets there first, harmless otherwise.
		time.Sleep(100 * time.Millisecond)
		_, err := s.txStmt(ctx, tx, releaseSQL)
		return err
	})
	if err != nil {
		t.Fatalf("transaction: %v", err)
	}
	if err := <-reader; err != nil {
		t.Fatalf("Events after the transaction: %v", err)
	}
}
