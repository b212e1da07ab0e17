package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// brokenJob sends 300 prompts through one lane of 8 to url, stopping once
// every endpoint has been broken for brokenAfter.
const brokenJob = `name: broken
model: sim-model
endpoints: [{url: "%s", engine: %s}]
sources:
  - {partition: P, path: prompts.jsonl, prompt: question, id: id}
lanes:
  - {name: short, concurrency: 8, max_tokens: 4096}
retry: {max_attempts: 4, base_delay: 100ms, max_delay: 1s%s}
monitor: {heartbeat_every: 200ms, dead_after: 2s, broken_after: %s}
output: {formats: [sharegpt]}
`

func writeBrokenJob(t *testing.T, url, engine, brokenAfter string, rows int) string {
	t.Helper()
	return writeBrokenJobRetry(t, url, engine, brokenAfter, "", rows)
}

// writeBrokenJobRetry is writeBrokenJob with more retry settings (", k: v").
func writeBrokenJobRetry(t *testing.T, url, engine, brokenAfter, retry string, rows int) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(brokenJob, url, engine, retry, brokenAfter)), 0o644); err != nil {
		t.Fatal(err)
	}
	writePrompts(t, filepath.Join(dir, "prompts.jsonl"), rows)
	return dir
}

// checkBrokenStop checks a run stopped by a broken endpoint: a non-zero
// exit naming the error and the setting, no dead letter, and every sample
// not done pending with no attempt spent.
func checkBrokenStop(t *testing.T, dir string, res result, rows int, wantErr string) (done int) {
	t.Helper()
	if res.code == 0 {
		t.Fatalf("run against a server broken mid-job exited 0:\n%s", res)
	}
	for _, w := range []string{wantErr, "monitor.broken_after", "every unfinished sample is pending"} {
		if !strings.Contains(res.stderr, w) {
			t.Errorf("stderr does not say %q:\n%s", w, res.stderr)
		}
	}
	srows, _ := storeRows(t, filepath.Join(dir, "broken.db"))
	states := map[string]int{}
	for _, r := range srows {
		states[r.State]++
		if r.State == "pending" && r.Attempts != 0 {
			t.Errorf("%s pending with %d attempts spent on the broken server, want 0", r.ID, r.Attempts)
		}
	}
	if states["dead"] != 0 || states["done"]+states["pending"] != rows || states["done"] == 0 {
		t.Errorf("store states %v: want no dead letter, the rest of %d done or pending, some done", states, rows)
	}
	rep, st := status(t, dir, "job.yaml")
	if rep.Total.Dead != 0 || rep.State == "DONE" {
		t.Errorf("status says %s with %d dead, want not DONE and 0 dead:\n%s", rep.State, rep.Total.Dead, st.stdout)
	}
	t.Logf("status: %s, exit %d", rep.State, st.code)
	return states["done"]
}

// TestE2EBrokenMidJobStandin: a stand-in that answers for 1.5 s and then
// says HTTP 500 "internal boom" (or sends a web page) to every request for
// ever: the run spends no attempt on it, dead-letters nothing, and stops
// with exit 1 once the endpoint has been broken for broken_after.
func TestE2EBrokenMidJobStandin(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		fail    func(w http.ResponseWriter)
		wantErr string
	}{
		{"500", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"internal boom"}}`)
		}, "HTTP 500): internal boom"},
		{"web page", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html><body>502 Bad Gateway</body></html>")
		}, "answered 200 with text/html, not an event stream: is this an OpenAI-compatible endpoint?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var failed, first atomic.Int64
			url, chats := chatStandin(t, "sim-model", func(w http.ResponseWriter, r *http.Request) {
				first.CompareAndSwap(0, time.Now().UnixNano())
				if time.Since(time.Unix(0, first.Load())) > 1500*time.Millisecond {
					failed.Add(1)
					tt.fail(w)
					return
				}
				time.Sleep(50 * time.Millisecond)
				streamOneToken(w)
			})
			const rows = 300
			dir := writeBrokenJob(t, url, "sglang", "3s", rows)
			res := regen(t, dir, "run", "job.yaml")
			done := checkBrokenStop(t, dir, res, rows, tt.wantErr)
			t.Logf("stopped after %s, exit %d: %d done, %d pending, 0 dead; %d requests, %d of them failed",
				res.dur.Round(time.Millisecond), res.code, done, rows-done, chats.Load(), failed.Load())
		})
	}
}

// TestE2EBrokenMidJobSim: the simulator's broken fault (every answer a
// 500 after 60 requests, /health healthy) is stopped the same way.
func TestE2EBrokenMidJobSim(t *testing.T) {
	t.Parallel()
	rs := startRecordingSim(t, map[string]any{"speed": 50, "load_time": 0, "warmup_time": 0, "output_mean": 20, "truncate_fraction": 0,
		"broken_after_requests": 60, "broken_message": "internal boom"})
	const rows = 300
	dir := writeBrokenJob(t, rs.url, "sim", "3s", rows)
	res := regen(t, dir, "run", "job.yaml")
	done := checkBrokenStop(t, dir, res, rows, "HTTP 500): internal boom")
	t.Logf("stopped after %s, exit %d: %d done, %d pending, 0 dead; %d requests (%d after the break)",
		res.dur.Round(time.Millisecond), res.code, done, rows-done, len(rs.requests()), len(rs.requests())-60)
}

// TestE2EBrokenPoisonOff: the poison guard turned off (retry.poison_after:
// 0) leaves the burn guard on: the simulator broken mid-job still burns
// nothing and the run stops.
func TestE2EBrokenPoisonOff(t *testing.T) {
	t.Parallel()
	rs := startRecordingSim(t, map[string]any{"speed": 50, "load_time": 0, "warmup_time": 0, "output_mean": 20, "truncate_fraction": 0,
		"broken_after_requests": 60, "broken_message": "internal boom"})
	const rows = 300
	dir := writeBrokenJobRetry(t, rs.url, "sim", "3s", ", poison_after: 0", rows)
	res := regen(t, dir, "run", "job.yaml")
	done := checkBrokenStop(t, dir, res, rows, "HTTP 500): internal boom")
	t.Logf("poison guard off: stopped after %s, exit %d: %d done, %d pending, 0 dead; %d requests",
		res.dur.Round(time.Millisecond), res.code, done, rows-done, len(rs.requests()))
}

// TestE2EBrokenRecovers: the simulator broken for a while after 60
// requests comes back; the endpoint resumes at its first answer and every
// sample is done exactly once, in one attempt.
func TestE2EBrokenRecovers(t *testing.T) {
	t.Parallel()
	rs := startRecordingSim(t, map[string]any{"speed": 50, "load_time": 0, "warmup_time": 0, "output_mean": 20, "truncate_fraction": 0,
		"broken_after_requests": 60, "broken_for": "200s", "broken_message": "internal boom"}) // 4 s of wall time
	const rows = 300
	dir := writeBrokenJob(t, rs.url, "sim", "60s", rows)
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 0 {
		t.Fatalf("run exited %d after the server recovered:\n%s", res.code, res)
	}
	srows, results := storeRows(t, filepath.Join(dir, "broken.db"))
	checkRowsOnce(t, srows, results, rows)
	db := openStoreRO(t, filepath.Join(dir, "broken.db"))
	c, err := storeCounts(context.Background(), db)
	if err != nil || c["done"] != rows {
		t.Errorf("store states %v (%v), want all %d done", c, err, rows)
	}
	t.Logf("finished in %s after the break: %d requests for %d samples", res.dur.Round(time.Millisecond), len(rs.requests()), rows)
}

// TestE2EBrokenNotByOwnErrorLast: the job's last prompt gets its own 500
// from a stand-in that answers every other prompt. With nothing left to
// compare it with, it is judged its own after retry.broken_streak failures
// alone: its attempts are spent and it is dead-lettered with the evidence;
// the endpoint is not called broken and the run ends (a re-run has nothing
// left to do).
func TestE2EBrokenNotByOwnErrorLast(t *testing.T) {
	t.Parallel()
	const rows = 60
	var badSent atomic.Int64
	url, _ := chatStandin(t, "sim-model", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), fmt.Sprintf("q%03d:", rows-1)) {
			badSent.Add(1)
			time.Sleep(100 * time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"template error"}}`)
			return
		}
		time.Sleep(50 * time.Millisecond)
		streamOneToken(w)
	})
	dir := writeBrokenJob(t, url, "sglang", "3s", rows)
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 0 || strings.Contains(res.stderr, "monitor.broken_after") {
		t.Fatalf("run with one bad prompt last exited %d, want 0 and no broken endpoint:\n%s", res.code, res)
	}
	srows, _ := storeRows(t, filepath.Join(dir, "broken.db"))
	states := map[string]int{}
	for _, r := range srows {
		states[r.State]++
		if r.State == "dead" && (r.ID != fmt.Sprintf("P/q%03d", rows-1) || r.Attempts != 4) {
			t.Errorf("dead %s after %d attempts, want only P/q%03d after 4", r.ID, r.Attempts, rows-1)
		}
	}
	if states["done"] != rows-1 || states["dead"] != 1 {
		t.Errorf("store states %v, want %d done and 1 dead", states, rows-1)
	}
	dead, err := os.ReadFile(filepath.Join(dir, "out", "broken.dead.jsonl"))
	if err != nil || !strings.Contains(string(dead), "template error") || !strings.Contains(string(dead), "nothing else answered") {
		t.Errorf("dead letters (%v) do not carry the server's error and the evidence:\n%s", err, dead)
	}
	if got := badSent.Load(); got != 10-1+4 {
		t.Errorf("bad prompt sent %d times, want 13 (9 free failures alone, then its 4 attempts)", got)
	}
	t.Logf("finished in %s, exit %d: %v; bad prompt sent %d times", res.dur.Round(time.Millisecond), res.code, states, badSent.Load())
}
