package main

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const affinityJob = `name: aff
model: sim-model
endpoints:
  - {url: "%s", engine: sim, kv_tokens: 231120}
  - {url: "%s", engine: sim, kv_tokens: 231120}
sources:
  - {partition: C, path: chats.jsonl, conversations: conversations, id: id}
lanes:
  - {name: default, concurrency: 32, max_tokens: 512}
monitor: {heartbeat_every: 200ms, dead_after: 2s}
quality: {truncated: false}
`

// storedTurn is where and when a turn's answer was stored.
type storedTurn struct {
	endpoint string
	at       time.Time
}

func storedEndpoints(t *testing.T, db *sql.DB) map[string]storedTurn {
	t.Helper()
	out := map[string]storedTurn{}
	for _, q := range []string{`SELECT sample_id, turn, endpoint, finished_at FROM turns`, `SELECT sample_id, turn, endpoint, finished_at FROM results`} {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, ep string
			var turn int
			var at int64
			if err := rows.Scan(&id, &turn, &ep, &at); err != nil {
				t.Fatal(err)
			}
			out[fmt.Sprintf("%s/%d", id, turn)] = storedTurn{ep, time.Unix(0, at)}
		}
		rows.Close()
	}
	return out
}

// TestE2EAffinityAfterKill regenerates conversations over two simulated
// servers, kills the runner with SIGKILL while conversations are between
// turns, and checks at the servers that every request for a later turn,
// before and after each kill, went to the server that answered the turn
// before it (the store remembers it with the turn), including the turns
// whose previous answer the killed runner stored.
func TestE2EAffinityAfterKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills the runner between turns; skipped with -short")
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0xaff))
	knobs := func(seed int) map[string]any {
		return map[string]any{"speed": 12, "output_mean": 60, "truncate_fraction": 0, "seed": seed, "load_time": 0, "warmup_time": 0}
	}
	sims := []*recordingSim{startRecordingSim(t, knobs(1)), startRecordingSim(t, knobs(2))}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(affinityJob, sims[0].url, sims[1].url)), 0o644); err != nil {
		t.Fatal(err)
	}
	want := writeChats(t, filepath.Join(dir, "chats.jsonl"), 200, rng)
	sw := &storeWatch{t: t, path: filepath.Join(dir, "aff.db")}
	var kills []time.Time
	for run := 0; len(kills) < 3 && run < 10; run++ {
		p := startRegen(t, dir, "run", "job.yaml")
		p.waitLine("ingest: ")
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		for !p.exited() && sw.midConversations() < 10 {
			time.Sleep(5 * time.Millisecond)
		}
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		res := p.wait(t)
		if !p.killed() {
			if res.code != 0 {
				t.Fatalf("run %d ended on its own with an error:\n%s", run, res)
			}
			break
		}
		kills = append(kills, time.Now())
	}
	if len(kills) < 3 {
		t.Fatalf("only %d kills landed mid-conversation; want 3", len(kills))
	}
	if final := regen(t, dir, "run", "job.yaml"); final.code != 0 {
		t.Fatalf("final run:\n%s", final)
	}
	stored := storedEndpoints(t, sw.open())
	total := 0
	for _, k := range want {
		total += k
	}
	if len(stored) != total {
		t.Fatalf("%d turns stored, want %d", len(stored), total)
	}
	later, crossed, wrong := 0, 0, 0
	for _, s := range sims {
		for _, r := range s.requests() {
			if r.turn == 0 {
				continue
			}
			later++
			prev, ok := stored[fmt.Sprintf("C/%s/%d", r.sample, r.turn-1)]
			if !ok {
				t.Fatalf("%s turn %d requested without turn %d stored", r.sample, r.turn, r.turn-1)
			}
			if prev.endpoint != s.url {
				wrong++
				if wrong <= 5 {
					t.Errorf("%s turn %d went to %s; turn %d was answered by %s", r.sample, r.turn, s.url, r.turn-1, prev.endpoint)
				}
			}
			for _, k := range kills {
				if prev.at.Before(k) && r.at.After(k) {
					crossed++
					break
				}
			}
		}
	}
	t.Logf("%d kills; %d requests for later turns, %d of them across a kill, %d to another server", len(kills), later, crossed, wrong)
	if crossed < 10 {
		t.Errorf("only %d later turns were asked for across a kill; want >= 10 for the test to mean anything", crossed)
	}
	per := map[string]int{}
	for _, s := range stored {
		per[s.endpoint]++
	}
	for _, s := range sims {
		if per[s.url] < total/4 {
			t.Errorf("%s answered %d of %d turns; want both servers used (%v)", s.url, per[s.url], total, strings.TrimSpace(fmt.Sprint(per)))
		}
	}
}
