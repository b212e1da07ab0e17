package capture

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/postgres"
	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
	"github.com/regen-dev/regen/internal/store/sqlite"
	"github.com/regen-dev/regen/internal/tokenrows"
)

// capSim starts a fast vLLM simulator writing hidden states (3 layers of
// 8, bf16) into a folder of its own, with fault every faultEvery-th file.
func capSim(t *testing.T, fault string, faultEvery int, tune func(*sim.Config)) (url, dir string) {
	t.Helper()
	c := sim.DefaultConfig()
	c.Engine, c.Speed, c.LoadTime, c.WarmupTime, c.ModelName = sim.EngineVLLM, 1000, 0, 0, "m"
	c.HiddenStates, c.HiddenSize, c.HiddenLayers, c.HiddenDType = t.TempDir(), 8, 3, "bf16"
	c.HiddenStatesFault, c.HiddenStatesFaultEvery = fault, max(faultEvery, 1)
	if tune != nil {
		tune(&c)
	}
	s, err := sim.New(c, io.Discard)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	url, err = s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sim start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	select {
	case <-s.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("sim not ready")
	}
	return url, c.HiddenStates
}

// answer is a stored answer with the token ids the capture sends.
func answer(t *testing.T, turn int, prompt, completion []int32) store.Result {
	t.Helper()
	res := llm.Result{Content: "x", FinishReason: "stop", PromptTokenIDs: prompt, CompletionTokenIDs: completion,
		Usage: llm.Usage{PromptTokens: len(prompt), CompletionTokens: len(completion)}}
	return store.Result{Response: reply.Encode(res, "http://gen", store.Provenance{}), FinishReason: "stop",
		PromptTokens: len(prompt), CompletionTokens: len(completion), Turn: turn}
}

func seqIDs(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(100 + (from+i)%5000)
	}
	return out
}

// doneStore is a SQLite store with n done samples s000.. : every third
// has two turns whose second prompt re-renders the first (so the whole
// conversation has no ids and only its turn rows do), the rest one.
func doneStore(t *testing.T, n int) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fillDone(t, st, n)
	return st
}

// fillDone ingests and answers doneStore's samples in st.
func fillDone(t *testing.T, st store.Store, n int) {
	t.Helper()
	ctx := context.Background()
	var in []store.NewSample
	for i := range n {
		id := fmt.Sprintf("p/s%03d", i)
		in = append(in, store.NewSample{ID: id, Partition: "p", Lane: "l", Body: []byte(`{"messages":[{"role":"user","content":"` + id + `"}]}`), Origin: "p.jsonl:" + id})
	}
	if _, err := st.Ingest(ctx, in); err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, "l", n, "gen", time.Minute)
	if err != nil || len(claimed) != n {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	for i, c := range claimed {
		p0, c0 := seqIDs(i*7, 5+i%4), seqIDs(i*7+50, 3)
		if i%3 == 0 {
			must(t, st.CompleteTurn(ctx, c.ID, "gen", answer(t, 0, p0, c0), ""))
			again, err := st.Claim(ctx, "l", 1, "gen", time.Minute)
			if err != nil || len(again) != 1 {
				t.Fatalf("claim turn 2: %v", err)
			}
			must(t, st.Complete(ctx, again[0].ID, "gen", answer(t, 1, append(slices.Clone(p0), 9, 9), seqIDs(i, 2))))
			continue
		}
		must(t, st.Complete(ctx, c.ID, "gen", answer(t, 0, p0, c0)))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testConfig(t *testing.T, urls ...string) Config {
	dir := t.TempDir()
	var eps []Endpoint
	for _, u := range urls {
		eps = append(eps, Endpoint{URL: u, Client: &VLLM{URL: u, Model: "m", FileWait: 5 * time.Second}})
	}
	return Config{Dir: filepath.Join(dir, "hidden_states"), JobDir: dir, Endpoints: eps, Concurrency: 4,
		MaxAttempts: 2, Owner: "cap", BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, DownAfter: time.Minute}
}

// listed reads every recorded file and checks each against the folder:
// the file exists, its sha256 and size match, and the folder holds no
// other file.
func listed(t *testing.T, st Store, cfg Config) []store.CapturedFile {
	t.Helper()
	var files []store.CapturedFile
	must(t, st.EachCapturedFile(context.Background(), func(f store.CapturedFile) error {
		files = append(files, f)
		return nil
	}))
	want := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(cfg.JobDir, f.Path))
		if err != nil {
			t.Errorf("recorded file of %s: %v", f.Key, err)
			continue
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != f.SHA256 || int64(len(b)) != f.Bytes {
			t.Errorf("%s: %d bytes sha256 %x, recorded %d bytes %s", f.Path, len(b), sum, f.Bytes, f.SHA256)
		}
		if want[f.Path] {
			t.Errorf("%s listed twice", f.Path)
		}
		want[f.Path] = true
	}
	entries, err := os.ReadDir(cfg.Dir)
	must(t, err)
	for _, e := range entries {
		if p := filepath.Join(filepath.Base(cfg.Dir), e.Name()); !want[p] {
			t.Errorf("%s is in the folder but not recorded", p)
		}
	}
	return files
}

// TestRunCapturesEveryRowOnce: every turn row of 30 done samples (50 rows)
// is captured once, with its file checked, placed under its stable name
// and recorded with the sha256 of its bytes; a second run sends nothing.
func TestRunCapturesEveryRowOnce(t *testing.T) {
	t.Parallel()
	url, simDir := capSim(t, "", 0, nil)
	st := doneStore(t, 30)
	cfg := testConfig(t, url)
	cfg.PerTurn = true
	sum, err := Run(context.Background(), st, cfg)
	if err != nil || sum.Err() != nil {
		t.Fatalf("Run: %v, %v", err, sum.Err())
	}
	if sum.Rows != 40 || sum.Captured != 40 || sum.NoIDs != 0 || sum.Dead != 0 {
		t.Errorf("summary %+v, want 40 rows captured", sum)
	}
	files := listed(t, st, cfg)
	if len(files) != 40 {
		t.Fatalf("%d files recorded, want 40", len(files))
	}
	for _, f := range files {
		if f.Layers != 3 || f.Hidden != 8 || f.DType != "bf16" || f.Path != filepath.Join("hidden_states", StableName(f.Key)+Ext) {
			t.Errorf("record %+v", f)
		}
		if strings.HasSuffix(f.Key, "/turn2") != (f.Turn == 1) || f.SampleID+"/turn"+fmt.Sprint(f.Turn+1) != f.Key {
			t.Errorf("record %s: sample %s turn %d", f.Key, f.SampleID, f.Turn)
		}
	}
	if left, _ := os.ReadDir(simDir); len(left) != 0 {
		t.Errorf("the server's folder keeps %d files after the capture (want its files moved, its locks removed)", len(left))
	}
	again, err := Run(context.Background(), st, cfg)
	if err != nil || again.Captured != 0 || again.Before != 40 {
		t.Errorf("second run: %+v, %v; want nothing captured, 40 before", again, err)
	}
	// Whole conversations: the re-rendered two-turn ones have no ids.
	conv := testConfig(t, url)
	st2 := doneStore(t, 30)
	sum, err = Run(context.Background(), st2, conv)
	if err != nil || sum.Rows != 20 || sum.NoIDs != 10 || sum.Captured != 20 {
		t.Errorf("conversation rows: %+v, %v; want 20 captured, 10 without ids", sum, err)
	}
	listed(t, st2, conv)
}

// TestRunFaultsNamed: every fault the simulator injects into the files or
// the answer is caught, spends the key's attempts and leaves it dead with
// evidence naming the kind; nothing bad is placed or recorded.
func TestRunFaultsNamed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fault, kind string
		tune        func(*sim.Config)
	}{
		{sim.HiddenFaultNaN, KindNaN, nil},
		{sim.HiddenFaultWrongIDs, KindTokenIDs, nil},
		{sim.HiddenFaultMissing, KindMissing, nil},
		{sim.HiddenFaultTruncated, KindTruncated, nil},
		{sim.HiddenFaultWrongPromptIDs, KindPromptIDs, nil},
		// The file is finished an hour (simulated: 3.6 s) after the answer,
		// past the 300 ms the capture waits for it.
		{sim.HiddenFaultSlow, KindSlow, func(c *sim.Config) { c.HiddenStatesSlow = time.Hour }},
	}
	for _, tt := range tests {
		t.Run(tt.fault, func(t *testing.T) {
			t.Parallel()
			url, simDir := capSim(t, tt.fault, 1, tt.tune)
			st := doneStore(t, 4)
			cfg := testConfig(t, url)
			cfg.Endpoints[0].Client.(*VLLM).FileWait = 300 * time.Millisecond
			sum, err := Run(context.Background(), st, cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			// s000 and s003 re-render their history: no ids, not sent.
			if sum.Dead != 2 || sum.Captured != 0 || !errors.Is(sum.Err(), ErrIncomplete) {
				t.Errorf("summary %+v, want the 2 rows with ids dead", sum)
			}
			fails, err := st.CaptureFailures(context.Background(), 0)
			must(t, err)
			for _, f := range fails {
				if f.State != store.Dead || f.Attempts != 2 || !strings.HasPrefix(f.LastError, tt.kind+": ") {
					t.Errorf("%s: %s after %d attempts: %q, want dead after 2 with %q", f.Key, f.State, f.Attempts, f.LastError, tt.kind)
				}
			}
			if len(fails) != 2 {
				t.Errorf("%d failures recorded, want 2", len(fails))
			}
			if got := listed(t, st, cfg); len(got) != 0 {
				t.Errorf("%d bad files recorded", len(got))
			}
			// The server handed each bad file over: regen removes it and its
			// lock (the slow writer's file is unlinked while it writes).
			if left, err := os.ReadDir(simDir); err != nil || len(left) != 0 {
				t.Errorf("the server's folder holds %d entries after the failures (%v), want none", len(left), err)
			}
		})
	}
}

// TestRunSlowWriterWaitedFor: a file the server finishes after answering
// is read once its writer's lock is released, not half written.
func TestRunSlowWriterWaitedFor(t *testing.T) {
	t.Parallel()
	// Finished 200 s simulated (0.2 s) after each answer.
	url, _ := capSim(t, sim.HiddenFaultSlow, 1, func(c *sim.Config) { c.HiddenStatesSlow = 200 * time.Second })
	st := doneStore(t, 6)
	cfg := testConfig(t, url)
	sum, err := Run(context.Background(), st, cfg)
	if err != nil || sum.Captured != 4 || sum.Dead != 0 {
		t.Fatalf("Run: %+v, %v; want the 4 rows with ids captured", sum, err)
	}
	listed(t, st, cfg)
}

// TestRunAdoptsPlacedFile: a run killed after placing a file and before
// recording it left the file under its stable name; the next run checks
// it and records it without asking the server again. A file under a
// key's name that is not its capture is removed (this run is the sole
// worker) and the key captured anew; a temporary copy a kill left is swept.
func TestRunAdoptsPlacedFile(t *testing.T) {
	t.Parallel()
	url, _ := capSim(t, "", 0, nil)
	first := testConfig(t, url)
	stA := doneStore(t, 6)
	if sum, err := Run(context.Background(), stA, first); err != nil || sum.Captured != 4 {
		t.Fatalf("first run: %+v, %v", sum, err)
	}
	filesA := listed(t, stA, first)

	// The same samples in a fresh store (the ids are the same), with the
	// folder as kills left it.
	stB := doneStore(t, 6)
	cfg := testConfig(t, url)
	must(t, os.MkdirAll(cfg.Dir, 0o755))
	adopted, stale := filesA[0], filesA[1]
	copyTo(t, filepath.Join(first.JobDir, adopted.Path), filepath.Join(cfg.JobDir, adopted.Path))
	copyTo(t, filepath.Join(first.JobDir, filesA[2].Path), filepath.Join(cfg.JobDir, stale.Path)) // another key's file
	must(t, os.WriteFile(filepath.Join(cfg.Dir, partPrefix+"abc.part"), []byte("half a copy"), 0o644))

	sum, err := Run(context.Background(), stB, cfg)
	if err != nil || sum.Adopted != 1 || sum.Captured != 3 || sum.SetAside != 1 {
		t.Fatalf("Run: %+v, %v; want 1 adopted, 3 captured, the other key's file removed", sum, err)
	}
	filesB := listed(t, stB, cfg)
	if len(filesB) != 4 {
		t.Fatalf("%d files, want 4", len(filesB))
	}
	for i, f := range filesB {
		if f.Key != filesA[i].Key || f.SHA256 != filesA[i].SHA256 {
			t.Errorf("%s: sha256 %s, the first run recorded %s for %s", f.Key, f.SHA256, filesA[i].SHA256, filesA[i].Key)
		}
	}
}

func copyTo(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	must(t, err)
	must(t, os.WriteFile(to, b, 0o644))
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestRunServerDown: a capture server that refuses connections spends no
// attempt; the run waits for it, captures everything once it comes up,
// and stops with ErrAllDown, keys back to pending, when it stays down
// past DownAfter.
func TestRunServerDown(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	st := doneStore(t, 6)
	cfg := testConfig(t, "http://"+addr)
	cfg.DownAfter = 500 * time.Millisecond
	_, err := Run(context.Background(), st, cfg)
	if !errors.Is(err, ErrAllDown) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Run against a dead server: %v, want ErrAllDown naming it", err)
	}
	counts, err := st.CaptureCounts(context.Background())
	must(t, err)
	fails, _ := st.CaptureFailures(context.Background(), 0)
	if counts.Leased != 0 || counts.Captured != 0 || len(fails) != 0 {
		t.Errorf("after the outage: %+v, failures %v; want nothing leased, no attempt spent", counts, fails)
	}

	// Down for a second, then up: everything captured, nothing spent.
	cfg.DownAfter = time.Minute
	go func() {
		time.Sleep(time.Second)
		c := sim.DefaultConfig()
		c.Engine, c.Speed, c.LoadTime, c.WarmupTime, c.ModelName = sim.EngineVLLM, 1000, 0, 0, "m"
		c.HiddenStates, c.HiddenSize, c.HiddenLayers = t.TempDir(), 8, 3
		s, err := sim.New(c, io.Discard)
		if err == nil {
			t.Cleanup(func() { s.Close() })
			_, err = s.Start(context.Background(), addr)
		}
		if err != nil {
			t.Errorf("late sim: %v", err)
		}
	}()
	sum, err := Run(context.Background(), st, cfg)
	if err != nil || sum.Captured != 4 {
		t.Fatalf("Run with the server up late: %+v, %v", sum, err)
	}
	if fails, _ := st.CaptureFailures(context.Background(), 0); len(fails) != 0 {
		t.Errorf("attempts spent on an outage: %v", fails)
	}
}

// TestRunWorkersShare: two workers capturing one job at once (a shared
// store) capture every row once between them: each key is claimed by
// one, the other waits for it and neither records it twice.
func TestRunWorkersShare(t *testing.T) {
	t.Parallel()
	url, _ := capSim(t, "", 0, nil)
	st := doneStore(t, 60)
	cfg := testConfig(t, url)
	cfg.PerTurn, cfg.Shared, cfg.Lease = true, true, 5*time.Second
	sums := make([]Summary, 2)
	errs := make([]error, 2)
	done := make(chan int)
	for w := range 2 {
		go func() {
			c := cfg
			c.Owner = fmt.Sprintf("w%d", w)
			sums[w], errs[w] = Run(context.Background(), st, c)
			done <- w
		}()
	}
	<-done
	<-done
	for w := range 2 {
		if errs[w] != nil {
			t.Fatalf("worker %d: %v", w, errs[w])
		}
	}
	if got := sums[0].Captured + sums[1].Captured; got != 80 || sums[0].Captured == 0 || sums[1].Captured == 0 {
		t.Errorf("captured %d + %d, want 80 rows between two busy workers", sums[0].Captured, sums[1].Captured)
	}
	if files := listed(t, st, cfg); len(files) != 80 {
		t.Errorf("%d files recorded, want 80", len(files))
	}
}

// TestRunCapturesAgainForNewIDs: a sample whose stored answer changed
// after its capture (generated again under a new configuration) is
// captured again: its old file is replaced by one of the new ids, under
// the same name, recorded once; the others are left alone.
func TestRunCapturesAgainForNewIDs(t *testing.T) {
	t.Parallel()
	url, _ := capSim(t, "", 0, nil)
	st := doneStore(t, 6)
	cfg := testConfig(t, url)
	if sum, err := Run(context.Background(), st, cfg); err != nil || sum.Captured != 4 {
		t.Fatalf("first run: %+v, %v", sum, err)
	}
	before := listed(t, st, cfg)
	newIDs := seqIDs(4000, 12)
	res := answer(t, 0, newIDs[:9], newIDs[9:])
	if _, err := st.DB().Exec(`UPDATE results SET response = ? WHERE sample_id = 'p/s001'`, res.Response); err != nil {
		t.Fatal(err)
	}
	sum, err := Run(context.Background(), st, cfg)
	if err != nil || sum.Captured != 1 || sum.Before != 3 {
		t.Fatalf("second run: %+v, %v; want s001 captured again, 3 kept", sum, err)
	}
	after := listed(t, st, cfg)
	ids := make([]int64, len(newIDs))
	for i, id := range newIDs {
		ids[i] = int64(id)
	}
	for i, f := range after {
		switch {
		case f.Key != "p/s001" && f.SHA256 != before[i].SHA256:
			t.Errorf("%s captured again though its ids did not change", f.Key)
		case f.Key == "p/s001":
			if f.SHA256 == before[i].SHA256 || f.Input != tokenrows.InputHash(newIDs) || f.Path != before[i].Path {
				t.Errorf("s001 after its ids changed: %+v (before %+v)", f, before[i])
			}
			if _, err := CheckFile(filepath.Join(cfg.JobDir, f.Path), ids, Expect{}); err != nil {
				t.Errorf("s001's file is not of its new ids: %v", err)
			}
		}
	}
}

// TestRunWorkersSharePostgres: two workers on one PostgreSQL job (each
// its own connection pool, as two hosts) capture every turn row once
// between them, taking over the keys a dead worker left leased once its
// lease ends.
func TestRunWorkersSharePostgres(t *testing.T) {
	t.Parallel()
	url, _ := capSim(t, "", 0, nil)
	dsn := pgtest.Get(t).Database(t)
	open := func() *postgres.Store {
		st, err := postgres.Open(context.Background(), dsn, postgres.Options{Schema: "regen_capture"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	first := open()
	fillDone(t, first, 60)
	// A worker that died holding three keys (turn rows of s001, s002, s004).
	for _, id := range []string{"p/s001", "p/s002", "p/s004"} {
		k := store.CaptureKey{Key: id + "/turn1", SampleID: id, Turn: 0}
		if _, ok, err := first.ClaimCapture(context.Background(), k, "dead", time.Second); err != nil || !ok {
			t.Fatalf("dead worker's claim: %v", err)
		}
	}
	cfg := testConfig(t, url)
	cfg.PerTurn, cfg.Shared, cfg.Lease = true, true, 2*time.Second
	sums := make([]Summary, 2)
	errs := make([]error, 2)
	done := make(chan struct{}, 2)
	for w, st := range []*postgres.Store{first, open()} {
		go func() {
			c := cfg
			c.Owner = fmt.Sprintf("w%d", w)
			sums[w], errs[w] = Run(context.Background(), st, c)
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("workers: %v, %v", errs[0], errs[1])
	}
	if got := sums[0].Captured + sums[1].Captured; got != 80 {
		t.Errorf("captured %d + %d, want 80 rows once between the workers", sums[0].Captured, sums[1].Captured)
	}
	if files := listed(t, first, cfg); len(files) != 80 {
		t.Errorf("%d files recorded, want 80", len(files))
	}
}

// stealing is a client that, for its first capture, lets another worker
// take the key's lease: while the server answers (the run's lease lapsed),
// or with beforeAnswer before the request, so the answer's path cannot be
// noted under the lost lease.
type stealing struct {
	Client
	st           Store
	beforeAnswer bool
	stole        atomic.Bool
	sent         atomic.Int64
}

func (s *stealing) Capture(ctx context.Context, r Request) (Result, error) {
	s.sent.Add(1)
	if s.beforeAnswer && s.stole.CompareAndSwap(false, true) {
		if err := s.steal(ctx, r.Key); err != nil {
			return Result{}, err
		}
	}
	res, err := s.Client.Capture(ctx, r)
	if err == nil && !s.beforeAnswer && s.stole.CompareAndSwap(false, true) {
		if err := s.steal(ctx, r.Key); err != nil {
			return res, err
		}
	}
	return res, err
}

// steal releases the run's leases and claims key as "thief".
func (s *stealing) steal(ctx context.Context, key string) error {
	if _, err := s.st.ReleaseCaptures(ctx, "cap"); err != nil {
		return err
	}
	k := store.CaptureKey{Key: key, SampleID: strings.Split(key, "/turn")[0], Turn: 0}
	if _, ok, err := s.st.ClaimCapture(ctx, k, "thief", 500*time.Millisecond); err != nil || !ok {
		return fmt.Errorf("steal %s: ok=%v %v", key, ok, err)
	}
	return nil
}

// TestRunLostLeaseThenAdopted: a worker whose lease was taken while its
// server answered places the file but cannot record it (fenced); it counts
// nothing, and once the other holder's lease ends the key is claimed
// again and the placed file checked and recorded, with no second request.
func TestRunLostLeaseThenAdopted(t *testing.T) {
	t.Parallel()
	url, _ := capSim(t, "", 0, nil)
	st := doneStore(t, 3) // s001 and s002 have ids; s000 re-renders its history
	cfg := testConfig(t, url)
	cfg.Concurrency, cfg.PerTurn, cfg.Shared, cfg.Lease = 1, true, true, 2*time.Second
	cl := &stealing{Client: cfg.Endpoints[0].Client, st: st}
	cfg.Endpoints[0].Client = cl
	sum, err := Run(context.Background(), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 4 turn rows: s000's two and one each for s001, s002.
	if sum.Captured != 3 || sum.Adopted != 1 || cl.sent.Load() != 4 {
		t.Errorf("summary %+v after %d requests; want 3 captured, 1 adopted after the lost lease, 4 requests", sum, cl.sent.Load())
	}
	if files := listed(t, st, cfg); len(files) != 4 {
		t.Errorf("%d files recorded, want 4", len(files))
	}
}
