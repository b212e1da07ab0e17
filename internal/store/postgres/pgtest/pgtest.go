// Package pgtest starts a real PostgreSQL server for the tests of one
// package: initdb into a temporary directory, the postgres binary as a child
// of the test process on a free loopback port below 32768, a Unix socket in
// the same directory, and a stop by PID when the package's tests end.
//
// Binaries are found on PATH, then in /usr/lib/postgresql/*/bin (newest
// first). PostgreSQL refuses to run as root, so when the tests run as root
// the server runs as the "postgres" user in a directory that user owns and
// whose parents it can traverse. When no binaries exist, a test that needs
// the server is skipped with a loud message, or fails when CI=true: CI must
// never pass by skipping.
//
// A package uses it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and each test asks for what it needs: pgtest.Get(t) for the shared server
// (started on first use), then srv.Database(t) for a DSN of a fresh database
// of its own.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune a server.
type Options struct {
	// Durable keeps fsync on, as in production; tests leave it off (a
	// crash of the server process loses nothing either way, only an OS
	// crash would), benchmarks of commit cost turn it on.
	Durable bool
	// Log, when set, receives the server's log lines (stderr).
	Log *os.File
	// TrustNet is a network (CIDR) whose clients connect as postgres
	// without a password, for a server that also listens on an address
	// outside loopback (Settings listen_addresses), e.g. a veth pair's.
	TrustNet string
	// Settings are more server settings (name=value), after the defaults
	// so they win: the benchmarks load pg_stat_statements and raise
	// max_connections.
	Settings []string
}

// Server is one PostgreSQL server this process started.
type Server struct {
	Port    int
	Dir     string // temporary root: data/, sock/, server.log
	BinDir  string
	opts    Options
	cred    *syscall.Credential // nil when not root
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	dbSeq   atomic.Int64
	adminMu sync.Mutex
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
)

// Main runs the package's tests and stops the shared server if one was
// started. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// Cleanup stops the shared server if one was started; a TestMain that does
// more than Main calls it after m.Run.
func Cleanup() {
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop server:", err)
		}
	}
}

// Get returns the package's shared server, starting it on first use. Without
// PostgreSQL binaries it skips t (fails it under CI=true).
func Get(t testing.TB) *Server {
	t.Helper()
	sharedOnce.Do(func() {
		shared, sharedErr = Start(Options{})
	})
	if sharedErr != nil {
		Unavailable(t, sharedErr)
	}
	return shared
}

// ErrNoBinaries says that no PostgreSQL installation was found.
var ErrNoBinaries = errors.New("no PostgreSQL binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin")

// Unavailable ends t because PostgreSQL cannot be used: skipped with a loud
// message when binaries are missing locally, failed under CI=true or for
// any other reason.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNoBinaries) && os.Getenv("CI") != "true" {
		msg := fmt.Sprintf("SKIPPED: %v. Install PostgreSQL (apt-get install postgresql) to run the PostgreSQL tests; under CI=true this is a failure.", err)
		fmt.Fprintln(os.Stderr, "pgtest:", msg)
		t.Skip(msg)
	}
	t.Fatalf("PostgreSQL test server: %v", err)
}

// BinDir finds the directory holding initdb and postgres.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir = filepath.Dir(real)
		}
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first: "9.6" < "15" numerically, not as strings.
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(a)), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(b)), 64)
		switch {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

// Start initialises a new cluster in a temporary directory and starts it.
func Start(o Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{BinDir: bin, opts: o}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, and PostgreSQL refuses root: no postgres user to run it as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if s.Dir, err = s.tempDir(); err != nil {
		return nil, err
	}
	if err := s.initdb(); err != nil {
		os.RemoveAll(s.Dir)
		return nil, err
	}
	// A port someone else takes between the probe and the bind is retried.
	for try := 0; ; try++ {
		if s.Port, err = freePort(); err != nil {
			os.RemoveAll(s.Dir)
			return nil, err
		}
		err = s.start()
		if err == nil {
			return s, nil
		}
		if try == 4 || !strings.Contains(err.Error(), "could not bind") {
			os.RemoveAll(s.Dir)
			return nil, err
		}
	}
}

// tempDir makes the server's root directory, owned by the server's user,
// under a parent every user can traverse.
func (s *Server) tempDir() (string, error) {
	parent := os.TempDir()
	if s.cred != nil && !traversable(parent) {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "regen-pg-")
	if err != nil {
		return "", fmt.Errorf("create server directory: %w", err)
	}
	if s.cred != nil {
		if !traversable(parent) {
			os.RemoveAll(dir)
			return "", fmt.Errorf("server directory %s: a parent is not traversable by the postgres user", dir)
		}
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("hand %s to the postgres user: %w", dir, err)
		}
	}
	return dir, nil
}

// traversable reports whether every directory from dir up to / can be
// entered by any user.
func traversable(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		st, err := os.Stat(dir)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// freePort picks a random loopback port below 32768 (outside the usual
// ephemeral range, so the kernel does not hand it to a client meanwhile)
// that is free now.
func freePort() (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, errors.New("no free port in 20000-31999 after 200 tries")
}

// command runs a PostgreSQL program as the server's user.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.BinDir, name), args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "data") }
func (s *Server) sockDir() string { return filepath.Join(s.Dir, "sock") }

func (s *Server) initdb() error {
	out, err := s.command("initdb", "-D", s.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// The superuser connects without a password; every other role over TCP
	// needs its password, so the tests can prove one is really sent.
	hba := "local all all trust\n" +
		"host all postgres 127.0.0.1/32 trust\n" +
		"host all all 127.0.0.1/32 scram-sha-256\n"
	if s.opts.TrustNet != "" {
		hba += "host all postgres " + s.opts.TrustNet + " trust\n"
	}
	if err := os.WriteFile(filepath.Join(s.dataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("write pg_hba.conf: %w", err)
	}
	if s.cred != nil {
		_ = os.Chown(filepath.Join(s.dataDir(), "pg_hba.conf"), int(s.cred.Uid), int(s.cred.Gid))
	}
	sock := s.sockDir()
	if err := os.Mkdir(sock, 0o755); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	if s.cred != nil {
		_ = os.Chown(sock, int(s.cred.Uid), int(s.cred.Gid))
	}
	return nil
}

// start runs postgres as a child and waits until it accepts connections.
func (s *Server) start() error {
	args := []string{"-D", s.dataDir(), "-p", strconv.Itoa(s.Port), "-k", s.sockDir(),
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
		"-c", "shared_buffers=64MB", "-c", "log_min_messages=warning"}
	if !s.opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	for _, kv := range s.opts.Settings {
		args = append(args, "-c", kv)
	}
	cmd := s.command("postgres", args...)
	// The server dies with the test binary even if the binary is killed.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	logPath := filepath.Join(s.Dir, "server.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if s.opts.Log != nil {
		cmd.Stderr = s.opts.Log
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.AdminDSN())
		if err == nil {
			conn.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres exited during start-up:\n%s", lastLines(string(b), 20))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres not ready after 60 s: %v\n%s", err, lastLines(string(b), 20))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// PID is the postmaster's process id (0 when stopped).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	select {
	case <-s.exited:
		return 0
	default:
		return s.cmd.Process.Pid
	}
}

// AdminDSN connects as the superuser to the postgres database.
func (s *Server) AdminDSN() string { return s.DSN("postgres") }

// DSN connects as the superuser to database db over TCP.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Exec runs SQL as the superuser in database db.
func (s *Server) Exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, s.DSN(db))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// Database creates a fresh, empty database and returns its DSN. It lives
// as long as the server.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// CREATE DATABASE copies template1 and takes a lock on it: one at a time.
	s.adminMu.Lock()
	err := s.Exec(ctx, "postgres", "CREATE DATABASE "+name)
	s.adminMu.Unlock()
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	return s.DSN(name)
}

// StopImmediate stops the server the way a crash would: `pg_ctl stop -m
// immediate` (SIGQUIT to the postmaster: no checkpoint, clients cut off,
// crash recovery at the next start). It returns once the process is gone.
func (s *Server) StopImmediate() error {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited == nil {
		return errors.New("server not running")
	}
	out, err := s.command("pg_ctl", "stop", "-D", s.dataDir(), "-m", "immediate", "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m immediate: %w\n%s", err, out)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(60 * time.Second):
		return errors.New("postgres still running 60 s after pg_ctl stop -m immediate")
	}
}

// Restart starts the server again on the same port and data (after
// StopImmediate); it runs crash recovery first.
func (s *Server) Restart() error {
	if s.PID() != 0 {
		return errors.New("server still running")
	}
	return s.start()
}

// Stop shuts the server down (fast shutdown, then SIGKILL after 30 s) and
// removes its directory.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	var err error
	if cmd != nil && cmd.Process != nil {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				err = errors.New("postgres ignored fast shutdown for 30 s; killed")
			}
		}
	}
	if rerr := os.RemoveAll(s.Dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}
