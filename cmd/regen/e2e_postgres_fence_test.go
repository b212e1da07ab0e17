package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// pgProxy is a TCP relay on loopback between one worker and PostgreSQL,
// so a test can hold the worker's store traffic (bytes wait in the relay,
// neither side sees an error) or cut it (every connection closed, new ones
// refused) while the worker's own server keeps answering.
type pgProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	held  bool
	cut   bool
	conns map[net.Conn]bool
}

func newPGProxy(t *testing.T, target string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
	})
	return p
}

func (p *pgProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.relay(c)
	}
}

func (p *pgProxy) relay(c net.Conn) {
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if cut {
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go p.pump(up, c)
	p.pump(c, up)
}

// pump copies src to dst, waiting at the gate while the proxy holds.
func (p *pgProxy) pump(src, dst net.Conn) {
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.held && !p.cut {
				p.cond.Wait()
			}
			cut := p.cut
			p.mu.Unlock()
			if cut {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: the deferred closes pass it on
		}
	}
}

// hold stops (true) or resumes (false) the traffic; nothing is lost.
func (p *pgProxy) hold(on bool) {
	p.mu.Lock()
	p.held = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

// setCut closes every relayed connection and refuses new ones (true), or
// lets new ones through again (false).
func (p *pgProxy) setCut(on bool) {
	p.mu.Lock()
	p.cut = on
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// fenceJob is sharedJob with a short dead_after, so a pause past it is
// short too.
func fenceJob(t *testing.T, name string, per, speed int) (dir string, want []string, dsn string) {
	t.Helper()
	dir, want, _, dsn = pgJob(t, name, per, speed)
	path := filepath.Join(dir, "job.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	job := strings.Replace(string(b), "monitor: {heartbeat_every: 250ms, dead_after: 3s}", "monitor: {heartbeat_every: 200ms, dead_after: 1500ms}", 1)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, want, dsn
}

// viaProxy points dsn at a proxy on port instead of the server.
func viaProxy(t *testing.T, dsn string, port int) string {
	t.Helper()
	srv := pgtest.Get(t)
	return strings.Replace(dsn, fmt.Sprintf("127.0.0.1:%d/", srv.Port), fmt.Sprintf("127.0.0.1:%d/", port), 1)
}

// fenceDB reads the job's schema straight from PostgreSQL (not through a proxy).
type fenceDB struct {
	conn   *pgx.Conn
	schema string
}

func openFenceDB(t *testing.T, dsn, job string) *fenceDB {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &fenceDB{conn: conn, schema: pgx.Identifier{postgres.SchemaFor(job)}.Sanitize()}
}

// lease is one sample leased to a worker, with its fencing token.
type lease struct {
	id, lane string
	token    int64
}

// owner returns the lease owner of the worker with pid, once it has beaten.
func (db *fenceDB) owner(t *testing.T, pid int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var owner string
		err := db.conn.QueryRow(context.Background(), `SELECT owner FROM `+db.schema+`.heartbeats WHERE pid = $1`, pid).Scan(&owner)
		if err == nil {
			return owner
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat from pid %d: %v", pid, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leases lists the samples owner holds.
func (db *fenceDB) leases(t *testing.T, owner string) []lease {
	t.Helper()
	rows, err := db.conn.Query(context.Background(), `SELECT id, lane, lease_token FROM `+db.schema+`.samples WHERE state = 1 AND lease_owner = $1`, owner)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
		var l lease
		err := r.Scan(&l.id, &l.lane, &l.token)
		return l, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stillHeld counts the samples of ls that still hold the same lease.
func (db *fenceDB) stillHeld(t *testing.T, ls []lease) int {
	t.Helper()
	ids, tokens := make([]string, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		ids[i], tokens[i] = l.id, l.token
	}
	var n int
	err := db.conn.QueryRow(context.Background(), `SELECT count(*) FROM `+db.schema+`.samples s
		JOIN unnest($1::text[], $2::int8[]) AS l(id, token) ON s.id = l.id WHERE s.state = 1 AND s.lease_token = l.token`, ids, tokens).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// auditResults makes every UPDATE or DELETE of a stored answer leave a row
// in results_audit: an answer overwritten or taken back shows there.
func (db *fenceDB) auditResults(t *testing.T) {
	t.Helper()
	s := db.schema
	for _, q := range []string{
		`CREATE TABLE ` + s + `.results_audit (sample_id text NOT NULL, op text NOT NULL)`,
		`CREATE FUNCTION ` + s + `.results_audit() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO ` + s + `.results_audit VALUES (OLD.sample_id, TG_OP); RETURN NULL; END $$`,
		`CREATE TRIGGER results_audit AFTER UPDATE OR DELETE ON ` + s + `.results FOR EACH ROW EXECUTE FUNCTION ` + s + `.results_audit()`,
	} {
		if _, err := db.conn.Exec(context.Background(), q); err != nil {
			t.Fatalf("audit results: %v", err)
		}
	}
}

func (db *fenceDB) audited(t *testing.T) []string {
	t.Helper()
	rows, err := db.conn.Query(context.Background(), `SELECT op || ' ' || sample_id FROM `+db.schema+`.results_audit`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// lostLine is one "lease lost" line of the workers' log.
type lostLine struct {
	pid    int
	id, op string
	token  int64
	at     time.Time // when the refused answer (or error) had arrived
}

var lostRE = regexp.MustCompile(`time=(\S+) .*msg="lease lost; outcome dropped" .*pid=(\d+) sample=(\S+) op="?([a-z -]+?)"? token=(\d+) answered_ago=(\S+) leases_lost=\d+`)

// leaseLost reads every "lease lost" line of the job's log (all workers
// append to it).
func leaseLost(t *testing.T, dir, job string) []lostLine {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ".regen", job, "regen.log"))
	if err != nil {
		t.Fatal(err)
	}
	var out []lostLine
	for _, m := range lostRE.FindAllStringSubmatch(string(b), -1) {
		logged, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("lease lost line: time %q: %v", m[1], err)
		}
		pid, _ := strconv.Atoi(m[2])
		tok, _ := strconv.ParseInt(m[5], 10, 64)
		ago, err := time.ParseDuration(m[6])
		if err != nil {
			t.Fatalf("lease lost line: answered_ago %q: %v", m[6], err)
		}
		out = append(out, lostLine{pid: pid, id: m[3], op: m[4], token: tok, at: logged.Add(-ago)})
	}
	return out
}

// pause is one SIGSTOP of a worker: the leases it held, and whether its
// store traffic was held first so that answers waited between the end of
// their stream and their commit.
type pause struct {
	slot, pid int
	commit    bool
	leases    []lease
	stoppedAt time.Time
}

// TestE2EPostgresFencing runs a 3,000-sample job with three workers (each
// with its own simulator and its own relay to PostgreSQL) and pauses a
// random worker with SIGSTOP 20 times, each past dead_after: the others
// return its leases and finish its samples; after SIGCONT its answers
// from those leases are refused by the store (lease owner and fencing
// token), logged as lost, and dropped, and the worker carries on. Every
// third pause first holds the worker's store traffic, so that answers
// whose stream has ended wait for their commit when the worker stops. At
// the end: every sample done once with one attempt, no stored answer
// updated or deleted (a trigger audits the results table), the export
// holds each sample once, and every lease held at a pause produced exactly
// one refused, logged commit.
//
// REGEN_CHAOS_SEED replays a run.
func TestE2EPostgresFencing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fencing test pauses workers 20 times in a 3,000-sample job; skipped with -short")
	}
	rng := chaosRNG(t, 0x66656e63)
	const (
		workers    = 3
		wantPauses = 20
		deadAfter  = 1500 * time.Millisecond
	)
	srv := pgtest.Get(t)
	dir, want, dsn := fenceJob(t, "pgfence", 1500, 6)
	db := openFenceDB(t, dsn, "pgfence")
	slots := make([]*proc, workers)
	proxies := make([]*pgProxy, workers)
	for i := range slots {
		proxies[i] = newPGProxy(t, fmt.Sprintf("127.0.0.1:%d", srv.Port))
		slots[i] = startRegenEnv(t, dir, []string{"REGEN_STORE=" + viaProxy(t, dsn, proxies[i].port())}, "run", "job.yaml")
	}
	if !slots[0].waitLine("ingest: ") {
		t.Fatalf("worker ended before ingest finished:\n%s", slots[0].wait(t))
	}
	db.auditResults(t)
	owners := make([]string, workers)
	for i, p := range slots {
		owners[i] = db.owner(t, p.cmd.Process.Pid)
	}

	began := time.Now()
	var pauses []pause
	for len(pauses) < wantPauses {
		for i, p := range slots {
			if p.exited() {
				t.Fatalf("worker %d ended after %d pauses (the job is too short for the pauses, or it failed):\n%s", i, len(pauses), p.wait(t))
			}
		}
		ps := pause{slot: rng.IntN(workers), commit: len(pauses)%3 == 2}
		ps.pid = slots[ps.slot].cmd.Process.Pid
		if ps.commit {
			proxies[ps.slot].hold(true)
			time.Sleep(time.Second) // streams end; their commits wait in the relay and behind it
		}
		start := time.Now()
		ps.stoppedAt = start
		if err := syscall.Kill(ps.pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // a commit sent before the stop lands
		ps.leases = db.leases(t, owners[ps.slot])
		// Past dead_after, and until the others have returned every lease.
		for time.Since(start) < deadAfter+time.Duration(500+rng.IntN(1000))*time.Millisecond || db.stillHeld(t, ps.leases) > 0 {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("pause %d: %d of %d leases of the paused worker still held after 30 s", len(pauses)+1, db.stillHeld(t, ps.leases), len(ps.leases))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := syscall.Kill(ps.pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if ps.commit {
			proxies[ps.slot].hold(false) // the held commits reach the store now, late
		}
		pauses = append(pauses, ps)
		// The worker beats again before it can be found dead again.
		time.Sleep(time.Duration(800+rng.IntN(700)) * time.Millisecond)
	}
	chaos := time.Since(began)

	for i, p := range slots {
		if res := p.wait(t); res.code != 0 {
			t.Fatalf("worker %d:\n%s", i, res)
		}
	}
	total := len(want)
	checkExport(t, filepath.Join(dir, "out"), "pgfence", want, false)
	checkAllOnce(t, dsn, "pgfence", total)
	if got := db.audited(t); len(got) != 0 {
		t.Errorf("stored answers updated or deleted: %v", got)
	}
	checkLateCommits(t, pauses, leaseLost(t, dir, "pgfence"), chaos)
}

// checkLateCommits checks that every lease a worker held when it was
// paused produced exactly one refused, logged commit from that worker, and
// that each pause that held the store first caught an answer between the
// end of its stream and its commit (one that had arrived before the stop).
func checkLateCommits(t *testing.T, pauses []pause, lost []lostLine, chaos time.Duration) {
	t.Helper()
	type key struct {
		pid   int
		id    string
		token int64
	}
	logged := map[key][]lostLine{}
	for _, l := range lost {
		k := key{l.pid, l.id, l.token}
		logged[k] = append(logged[k], l)
	}
	leases, refused, commitPauses, between := 0, 0, 0, 0
	expected := map[key]bool{}
	for i, ps := range pauses {
		caught := 0
		for _, l := range ps.leases {
			k := key{ps.pid, l.id, l.token}
			expected[k] = true
			leases++
			switch got := logged[k]; len(got) {
			case 0:
				t.Errorf("pause %d (pid %d): the late outcome of %s (token %d) was not logged as refused", i+1, ps.pid, l.id, l.token)
			case 1:
				refused++
				if got[0].at.Before(ps.stoppedAt) {
					caught++
				}
			default:
				t.Errorf("pause %d (pid %d): %s (token %d) refused %d times, want once", i+1, ps.pid, l.id, l.token, len(got))
			}
		}
		if ps.commit {
			commitPauses++
			between += caught
			if caught == 0 {
				// On a loaded machine no stream may end in the hold's
				// second; the case is proven by the pauses that caught one.
				t.Logf("pause %d (pid %d, store held first): no answer waited between its stream's end and its commit", i+1, ps.pid)
			}
		}
	}
	other := 0
	for k := range logged {
		if !expected[k] {
			other++
		}
	}
	t.Logf("%d pauses (%d with the store held first) in %s: %d leases held at the stop, %d late commits refused and logged (%d of those of the store-held pauses answered before the stop); %d other refusals logged",
		len(pauses), commitPauses, chaos.Round(time.Millisecond), leases, refused, between, other)
	if leases == 0 {
		t.Errorf("no paused worker held a lease: the pauses tested nothing")
	}
	if commitPauses > 0 && between == 0 {
		t.Errorf("none of the %d store-held pauses caught an answer between its stream's end and its commit", commitPauses)
	}
}

// netRoute is a network namespace joined to this one by a veth pair: a
// worker run inside it reaches the host side's address only over the
// pair, so the test can cut that route (a blackhole route in the
// namespace: packets vanish, no error reaches either side) and heal it.
type netRoute struct {
	ns, hostIP string
}

// newNetRoute creates the namespace and the pair (removed at cleanup).
// Without root or iproute2 it skips locally and fails under CI=true.
func newNetRoute(t *testing.T) *netRoute {
	t.Helper()
	n := os.Getpid() % 100000
	r := &netRoute{ns: fmt.Sprintf("rgf%d", n), hostIP: fmt.Sprintf("10.201.%d.1", n%250)}
	host, peer, nsIP := fmt.Sprintf("rgfh%d", n), fmt.Sprintf("rgfn%d", n), fmt.Sprintf("10.201.%d.2", n%250)
	steps := [][]string{
		{"netns", "add", r.ns},
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", r.ns},
		{"addr", "add", r.hostIP + "/30", "dev", host},
		{"link", "set", host, "up"},
		{"-n", r.ns, "addr", "add", nsIP + "/30", "dev", peer},
		{"-n", r.ns, "link", "set", peer, "up"},
		{"-n", r.ns, "link", "set", "lo", "up"},
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", host).Run()
		_ = exec.Command("ip", "netns", "del", r.ns).Run()
	})
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			msg := fmt.Sprintf("network namespace: ip %s: %v %s (needs root and iproute2)", strings.Join(s, " "), err, out)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip("SKIPPED: " + msg)
		}
	}
	return r
}

// cut blackholes (true) or restores (false) the namespace's route to the host side.
func (r *netRoute) cut(t *testing.T, on bool) {
	t.Helper()
	op := "del"
	if on {
		op = "add"
	}
	if out, err := exec.Command("ip", "-n", r.ns, "route", op, "blackhole", r.hostIP+"/32").CombinedOutput(); err != nil {
		t.Fatalf("route %s: %v %s", op, err, out)
	}
}

// TestE2EPostgresPartition cuts the route from one worker (in a network
// namespace of the test's own, with PostgreSQL listening on the host side
// of a veth pair) to the database while its simulator, inside the same
// namespace, keeps answering; a second worker runs on the host. The worker
// says DOWN with the store as the cause and keeps its answers; after the
// route heals it commits them when its leases are still its own
// (dead_after longer than the cut) or has them refused, logged and dropped
// when the other worker took its samples (dead_after shorter). Every
// sample is done once, with one attempt, no stored answer is updated or
// deleted, and the export holds each once.
func TestE2EPostgresPartition(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("partition test cuts a worker off its database for 14 s, twice; skipped with -short")
	}
	route := newNetRoute(t)
	srv, err := pgtest.Start(pgtest.Options{TrustNet: route.hostIP + "/30",
		Settings: []string{"listen_addresses=127.0.0.1," + route.hostIP}})
	if err != nil {
		pgtest.Unavailable(t, err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	const cutFor = 14 * time.Second // past the store's dead-route bound (10 s), so calls fail and say so
	for _, tt := range []struct {
		name      string
		deadAfter string
		moved     bool
	}{
		{name: "lease held", deadAfter: "60s"},
		{name: "lease moved", deadAfter: "1500ms", moved: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			job := "pgcut_" + strings.ReplaceAll(tt.name, " ", "_")
			dsn := srv.Database(t)
			dir := t.TempDir()
			spec := strings.Replace(fmt.Sprintf(sharedJob, job, 6), "dead_after: 3s", "dead_after: "+tt.deadAfter, 1)
			if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(spec), 0o644); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 0x6375))
			want := writeChaosSource(t, filepath.Join(dir, "a.jsonl"), "A", 250, rng)
			want = append(want, writeChaosSource(t, filepath.Join(dir, "b.jsonl.gz"), "B", 250, rng)...)
			nsDSN := strings.Replace(dsn, "127.0.0.1:", route.hostIP+":", 1)
			cutOff := startRegenVia(t, []string{"ip", "netns", "exec", route.ns}, dir, []string{"REGEN_STORE=" + nsDSN}, "run", "--progress-every", "300ms", "job.yaml")
			if !cutOff.waitLine("ingest: ") {
				t.Fatalf("worker in the namespace ended before ingest finished:\n%s", cutOff.wait(t))
			}
			other := startRegenEnv(t, dir, []string{"REGEN_STORE=" + dsn}, "run", "job.yaml")
			db := openFenceDB(t, dsn, job)
			db.auditResults(t)
			owner := db.owner(t, cutOff.cmd.Process.Pid)
			time.Sleep(time.Second) // requests in flight on both
			route.cut(t, true)
			cutAt := time.Now()
			time.Sleep(300 * time.Millisecond)
			held := db.leases(t, owner)
			for !strings.Contains(cutOff.stdout(), "store down for") {
				if cutOff.exited() {
					t.Fatalf("worker exited while cut off:\n%s", cutOff.wait(t))
				}
				if time.Since(cutAt) > cutFor+20*time.Second {
					t.Fatalf("worker never said DOWN with the store as the cause:\n%s", cutOff.stdout())
				}
				time.Sleep(100 * time.Millisecond)
			}
			downAfter := time.Since(cutAt)
			for time.Since(cutAt) < cutFor {
				time.Sleep(100 * time.Millisecond)
			}
			still := db.stillHeld(t, held)
			route.cut(t, false)
			healAt := time.Now()
			for i, p := range []*proc{cutOff, other} {
				if res := p.wait(t); res.code != 0 {
					t.Fatalf("worker %d:\n%s", i, res)
				}
			}
			checkExport(t, filepath.Join(dir, "out"), job, want, false)
			checkAllOnce(t, dsn, job, len(want))
			if got := db.audited(t); len(got) != 0 {
				t.Errorf("stored answers updated or deleted: %v", got)
			}
			var lost []lostLine
			for _, l := range leaseLost(t, dir, job) {
				if l.pid == cutOff.cmd.Process.Pid {
					lost = append(lost, l)
				}
			}
			t.Logf("cut %s: DOWN after %s; %d leases held at the cut, %d still its own at the heal; %d outcomes refused after the heal",
				cutFor, downAfter.Round(time.Millisecond), len(held), still, len(lost))
			if len(held) == 0 {
				t.Fatal("the worker held no lease at the cut: the test tested nothing")
			}
			if tt.moved {
				if still != 0 {
					t.Errorf("%d of %d leases still the cut-off worker's at the heal, want all moved (dead_after %s)", still, len(held), tt.deadAfter)
				}
				checkLateCommits(t, []pause{{pid: cutOff.cmd.Process.Pid, commit: true, leases: held, stoppedAt: healAt}}, lost, cutFor)
				return
			}
			if still != len(held) || len(lost) != 0 {
				t.Errorf("lease held: %d of %d leases its own at the heal and %d outcomes refused; want all and none", still, len(held), len(lost))
			}
			db.checkFinishedUnder(t, held)
		})
	}
}

// checkFinishedUnder checks that every sample of ls was finished under
// the very lease it had then (a finished row keeps the token of the lease
// it was finished under), or escalated from its lane under it and
// finished in the next: the answers a cut-off worker held were committed
// by that worker, once its route healed.
func (db *fenceDB) checkFinishedUnder(t *testing.T, ls []lease) {
	t.Helper()
	ids, lanes, tokens := make([]string, len(ls)), make([]string, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		ids[i], lanes[i], tokens[i] = l.id, l.lane, l.token
	}
	var n int
	err := db.conn.QueryRow(context.Background(), `SELECT count(*) FROM `+db.schema+`.samples s
		JOIN unnest($1::text[], $2::text[], $3::int8[]) AS l(id, lane, token) ON s.id = l.id
		WHERE s.state = 2 AND (s.lease_token = l.token OR s.lane <> l.lane)`, ids, lanes, tokens).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(ls) {
		t.Errorf("%d of the %d samples held across the cut were finished under the lease held at the cut (or escalated under it), want all", n, len(ls))
	}
}
