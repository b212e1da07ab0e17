package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	sqlitedriver "modernc.org/sqlite"

	"github.com/regen-dev/regen/internal/store"
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

// A claim's statement is prepared once: SQLite compiles a statement again
// when a bound value it planned with changes, and it reads a bare
// LIMIT :n, which the dispatcher varies with its free slots, so every
// claim was parsed and planned again (70 authorizer calls each, a flat
// ~20 µs per turn in BenchmarkTurnCost). SQLite consults the authorizer
// only while compiling, so its calls count compiles.
func TestClaimsDoNotRecompile(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	s, _ := openTemp(t, Options{Now: func() time.Time {
		clock = clock.Add(time.Second) // a new :now and :until every claim
		return clock
	}})
	ctx := context.Background()
	var ns []store.NewSample
	for i := range 60 {
		ns = append(ns, store.NewSample{ID: fmt.Sprintf("s%02d", i), Partition: "p", Lane: "short", Body: []byte(`{}`), Origin: fmt.Sprintf("p.jsonl:%d", i+1)})
	}
	if _, err := s.Ingest(ctx, ns); err != nil {
		t.Fatal(err)
	}
	var compiles atomic.Int64
	countCompiles(t, s, func(sqlitedriver.AuthorizerActionCode, string, string, string, string) sqlitedriver.AuthorizerReturnCode {
		compiles.Add(1)
		return sqlitedriver.AuthorizerOK
	})
	claim := func(n int, kept []store.Kept) {
		t.Helper()
		got, err := s.ClaimKept(ctx, "short", n, "o", time.Hour, kept)
		if err != nil || len(got) != n {
			t.Fatalf("claim %d: %d claimed, %v", n, len(got), err)
		}
	}
	claim(1, nil)
	claim(1, []store.Kept{{ID: "s00", Turn: 1}})
	if compiles.Load() == 0 {
		t.Fatal("no compile seen while preparing the claims: the authorizer does not count compiles")
	}
	compiles.Store(0)
	for n := 2; n <= 6; n++ {
		claim(n, nil)
		claim(n, make([]store.Kept, n)) // a kept list of another length
	}
	if got := compiles.Load(); got != 0 {
		t.Errorf("claims with new :n, :now and :kept compiled again (%d authorizer calls), want their prepared plans reused", got)
	}
}

// countCompiles installs fn as the authorizer of s's one connection.
func countCompiles(t *testing.T, s *Store, fn sqlitedriver.AuthorizerFn) {
	t.Helper()
	c, err := s.DB().Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Raw(func(dc any) error {
		ar, ok := dc.(sqlitedriver.AuthorizerRegisterer)
		if !ok {
			return fmt.Errorf("driver connection %T has no authorizer", dc)
		}
		return ar.RegisterAuthorizer(fn)
	})
	if err != nil {
		t.Fatal(err)
	}
}
