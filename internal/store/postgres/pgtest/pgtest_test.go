package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// TestServerSurvivesImmediateRestart checks the harness itself: a fresh
// database, a committed row, a crash-like stop by pg_ctl, a restart on the
// same port, and the row still there.
func TestServerSurvivesImmediateRestart(t *testing.T) {
	srv := Get(t)
	ctx := context.Background()
	dsn := srv.Database(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	pid := srv.PID()
	if pid == 0 {
		t.Fatal("PID() = 0 for a running server")
	}
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if got := srv.PID(); got != 0 {
		t.Fatalf("PID() = %d after StopImmediate, want 0", got)
	}
	if _, err := pgx.Connect(ctx, dsn); err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if srv.PID() == pid {
		t.Errorf("restarted server has the old pid %d", pid)
	}
	conn, err = pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, `SELECT v FROM t`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("after restart: v = %d, %v; want 42", v, err)
	}
	// A second database is independent of the first.
	other, err := pgx.Connect(ctx, srv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, `SELECT v FROM t`); err == nil {
		t.Error("a fresh database sees another database's table")
	}
}
