package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/sim"
)

// simRequest is one generation request the test's simulator received.
type simRequest struct {
	at      time.Time
	sample  string   // the conversation id, from the first user message
	turn    int      // assistant messages in the history = the turn asked for
	history []string // the contents of those assistant messages
}

// recordingSim starts a simulator in the test process, outside the runner
// that gets killed, and records every generation request it receives.
type recordingSim struct {
	url string
	mu  sync.Mutex
	log []simRequest
	bad []string
}

func startRecordingSim(t *testing.T, knobs map[string]any) *recordingSim {
	t.Helper()
	rs := &recordingSim{}
	c := sim.DefaultConfig()
	// The step times these tests were written against; knobs may name another profile.
	if err := c.UseProfile(sim.ProfileFast); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(knobs); err != nil {
		t.Fatal(err)
	}
	c.RecordRequest = rs.record
	s, err := sim.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs.url, err = s.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Close() })
	return rs
}

func (rs *recordingSim) record(body []byte) {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	r := simRequest{at: time.Now()}
	err := json.Unmarshal(body, &req)
	for _, m := range req.Messages {
		var text string
		_ = json.Unmarshal(m.Content, &text)
		switch {
		case m.Role == "assistant":
			r.turn++
			r.history = append(r.history, text)
		case m.Role == "user" && r.sample == "":
			r.sample, _, _ = strings.Cut(text, " ")
		}
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if err != nil || r.sample == "" {
		rs.bad = append(rs.bad, string(body))
		return
	}
	rs.log = append(rs.log, r)
}

func (rs *recordingSim) requests() []simRequest {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return append([]simRequest(nil), rs.log...)
}

const multiTurnJob = `name: mt
model: sim-model
endpoints: [{url: "%s", engine: sim}]
sources:
  - {partition: C, path: chats.jsonl, conversations: conversations, id: id}
lanes:
  - {name: default, concurrency: 48, max_tokens: 512}
monitor: {heartbeat_every: 200ms, dead_after: 2s}
output: {formats: [sharegpt, openai-batch], metadata: full}
# Every conversation must come out whole: an answer cut at max_tokens still
# counts here (the test is about kills between turns, not answer quality).
quality: {truncated: false}
`

// writeChats writes n conversations of 1 to 6 exchanges and returns each
// conversation's number of assistant turns.
func writeChats(t *testing.T, path string, n int, rng *rand.Rand) map[string]int {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	enc := json.NewEncoder(f)
	turns := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("c%04d", i)
		k := 1 + rng.IntN(6)
		var conv []map[string]string
		for j := range k {
			conv = append(conv,
				map[string]string{"from": "human", "value": fmt.Sprintf("%s question %d: %s", id, j, strings.Repeat("tell me more ", 1+rng.IntN(20)))},
				map[string]string{"from": "gpt", "value": "the dataset's answer, replaced"})
		}
		if err := enc.Encode(map[string]any{"id": id, "conversations": conv}); err != nil {
			t.Fatal(err)
		}
		turns["C/"+id] = k
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return turns
}

// storeWatch reads a runner's SQLite store from the test, once it exists.
type storeWatch struct {
	t    *testing.T
	path string
	db   *sql.DB
}

// open opens the store read-only the first time it is asked.
func (w *storeWatch) open() *sql.DB {
	if w.db == nil {
		w.db = openStoreRO(w.t, w.path)
	}
	return w.db
}

// midConversations counts conversations with some turns stored and more
// to go; 0 while the store or its schema does not exist yet.
func (w *storeWatch) midConversations() int {
	if w.db == nil {
		if _, err := os.Stat(w.path); err != nil {
			return 0
		}
	}
	var n int
	if err := w.open().QueryRow(`SELECT count(*) FROM samples WHERE turn > 0 AND state IN ('pending', 'leased')`).Scan(&n); err != nil {
		return 0
	}
	return n
}

// storedAnswer is one answer the store kept: its turn, when, and its text.
type storedAnswer struct {
	at      time.Time
	content string
}

// storedAnswers reads every stored answer by sample and turn.
func storedAnswers(t *testing.T, db *sql.DB) map[string]map[int]storedAnswer {
	t.Helper()
	out := map[string]map[int]storedAnswer{}
	for _, q := range []string{`SELECT sample_id, turn, finished_at, response FROM turns`, `SELECT sample_id, turn, finished_at, response FROM results`} {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			var turn int
			var at int64
			var resp []byte
			if err := rows.Scan(&id, &turn, &at, &resp); err != nil {
				t.Fatal(err)
			}
			var r struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(resp, &r); err != nil {
				t.Fatalf("stored answer %s/%d: %v", id, turn, err)
			}
			if out[id] == nil {
				out[id] = map[int]storedAnswer{}
			}
			if _, dup := out[id][turn]; dup {
				t.Errorf("%s turn %d stored twice", id, turn)
			}
			out[id][turn] = storedAnswer{at: time.Unix(0, at), content: r.Content}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return out
}

// TestE2EMultiTurnKills regenerates 500 conversations of 1 to 6 assistant
// turns, killing the runner with SIGKILL at least ten times while
// conversations are between turns, and checks at the simulator, in the
// store and in the export that every conversation is complete, every turn
// was stored exactly once, no turn was asked for again after it was
// stored, and every request carried the model's own earlier answers.
func TestE2EMultiTurnKills(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-turn chaos test runs 500 conversations with a dozen kills; skipped with -short")
	}
	rng := chaosRNG(t, 0x6d74)

	rs := startRecordingSim(t, map[string]any{"speed": 12, "output_mean": 60, "truncate_fraction": 0, "seed": 11, "load_time": 0, "warmup_time": 0})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(multiTurnJob, rs.url)), 0o644); err != nil {
		t.Fatal(err)
	}
	want := writeChats(t, filepath.Join(dir, "chats.jsonl"), 500, rng)
	totalTurns := 0
	for _, k := range want {
		totalTurns += k
	}

	sw := &storeWatch{t: t, path: filepath.Join(dir, "mt.db")}
	midConversation := sw.midConversations

	start := time.Now()
	kills := 0
	for run := 0; kills < 12 && run < 40; run++ {
		p := startRegen(t, dir, "run", "job.yaml")
		p.waitLine("ingest: ")
		time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond)
		for !p.exited() && midConversation() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		mid := midConversation()
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		res := p.wait(t)
		if !p.killed() {
			if res.code != 0 {
				t.Fatalf("run %d ended on its own with an error:\n%s", run, res)
			}
			t.Logf("run %d finished before the kill", run)
			break
		}
		kills++
		t.Logf("kill %2d after %-6s: %d conversations between turns, %d requests so far",
			kills, time.Since(p.start).Round(time.Millisecond), mid, len(rs.requests()))
	}
	if kills < 10 {
		t.Fatalf("only %d kills landed mid-conversation; want >= 10", kills)
	}
	final := regen(t, dir, "run", "job.yaml")
	if final.code != 0 {
		t.Fatalf("final run:\n%s", final)
	}
	t.Logf("%d kills; final run %s; whole sequence %s", kills, final.dur.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	// The store: every conversation done at its last turn, every turn stored once.
	db := sw.open()
	c, err := storeCounts(context.Background(), db)
	if err != nil || c["done"] != len(want) || len(c) != 1 {
		t.Fatalf("store states %v (%v), want all %d done", c, err, len(want))
	}
	stored := storedAnswers(t, db)
	storedTurns := 0
	for id, k := range want {
		for turn := range k {
			if _, ok := stored[id][turn]; !ok {
				t.Errorf("%s: turn %d of %d not stored", id, turn, k)
			}
		}
		storedTurns += len(stored[id])
		if len(stored[id]) != k {
			t.Errorf("%s: %d turns stored, want %d", id, len(stored[id]), k)
		}
	}

	// The simulator: every turn asked for, none after it was stored, and
	// every request carrying the stored answers of the turns before it.
	reqs := rs.requests()
	if len(rs.bad) > 0 {
		t.Errorf("%d requests the test could not attribute, first: %.200s", len(rs.bad), rs.bad[0])
	}
	perTurn := map[string]int{}
	redone, wrongHistory := 0, 0
	for _, r := range reqs {
		id := "C/" + r.sample
		perTurn[fmt.Sprintf("%s/%d", id, r.turn)]++
		ans, ok := stored[id][r.turn]
		if !ok {
			t.Errorf("request for %s turn %d, which the conversation does not have", id, r.turn)
			continue
		}
		// A request arriving after its turn's answer was stored would redo
		// a finished turn (sub-millisecond clock skew between the two
		// processes is far below a request's duration).
		if r.at.After(ans.at.Add(time.Millisecond)) {
			redone++
			if redone <= 5 {
				t.Errorf("%s turn %d asked for at %s, after its answer was stored at %s", id, r.turn, r.at.Format(time.StampMicro), ans.at.Format(time.StampMicro))
			}
		}
		for j, h := range r.history {
			if h != stored[id][j].content {
				wrongHistory++
				if wrongHistory <= 5 {
					t.Errorf("%s turn %d: history answer %d is %.60q, the stored answer is %.60q", id, r.turn, j, h, stored[id][j].content)
				}
				break
			}
		}
	}
	again := 0
	for id, k := range want {
		for turn := range k {
			n := perTurn[fmt.Sprintf("%s/%d", id, turn)]
			if n == 0 {
				t.Errorf("%s turn %d never reached the simulator", id, turn)
			}
			again += max(n-1, 0)
		}
	}
	if redone > 0 || wrongHistory > 0 {
		t.Errorf("%d requests redid a stored turn, %d carried a history other than the stored answers", redone, wrongHistory)
	}
	t.Logf("%d conversations, %d turns stored (want %d), %d requests at the simulator: %d turns asked for again because a kill cut them off in flight, 0 after they were stored",
		len(want), storedTurns, totalTurns, len(reqs), again)

	// The export: every conversation whole, each answer the stored one.
	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	ex := checkExport(t, filepath.Join(dir, "out"), "mt", ids, false)
	for _, r := range ex.shareGPT {
		n := 0
		for _, m := range r.Conversations {
			if m.Role == "assistant" {
				if m.Content == nil || *m.Content != stored[r.ID][n].content {
					t.Errorf("%s: exported answer %d differs from the stored one", r.ID, n)
				}
				n++
			}
		}
		if n != want[r.ID] {
			t.Errorf("%s: %d answers exported, want %d", r.ID, n, want[r.ID])
		}
	}
	if resp, err := http.Get(rs.url + "/v1/models"); err == nil {
		resp.Body.Close()
	}
}
