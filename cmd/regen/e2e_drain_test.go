package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestE2EDrainFinishesJob: a SIGINT with the job's last 16 samples in
// flight; the drain completes them, so the job is finished: the run
// exports, prints its summary and exits like any finished run, and status
// says DONE. When every answer was rejected (an empty answer each), the
// finished job exits 1 and says the training file is empty.
func TestE2EDrainFinishesJob(t *testing.T) {
	t.Parallel()
	const rows, lane = 40, 16
	tests := []struct {
		name         string
		answer       string
		code         int
		done, reject int
		say          []string
	}{
		{"answers kept", "The answer is four.", 0, rows, 0,
			[]string{fmt.Sprintf("%d done, 0 rejected", rows)}},
		{"every answer rejected", "", 1, 0, rows,
			[]string{"no sample done", fmt.Sprintf("%d rejected", rows), "training files are empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startAnswerServer(t, tt.answer)
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"job.yaml": ownJob(srv.url, lane)})
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), rows)
			srv.holdAfter(rows - lane)
			p := startRegen(t, dir, "run", "--drain-timeout", "1m", "job.yaml")
			db := openStoreRO(t, filepath.Join(dir, "own.db"))
			for {
				c, err := storeCounts(context.Background(), db)
				if err == nil && c["pending"] == 0 && c["leased"] == lane {
					break
				}
				if p.exited() {
					t.Fatalf("run ended before its last samples were in flight:\n%s", p.wait(t))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			for !strings.Contains(p.stderr.String(), "draining") {
				if p.exited() {
					t.Fatalf("run ended without draining:\n%s", p.wait(t))
				}
				time.Sleep(10 * time.Millisecond)
			}
			// While the drain waits on the server, status says so.
			for deadline := time.Now().Add(10 * time.Second); ; {
				rep, _ := status(t, dir, "job.yaml")
				if rep.State == monitor.Draining && strings.Contains(strings.Join(rep.Evidence, "; "), fmt.Sprintf("waiting for %d requests in flight", lane)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("status during the drain: %s %q, want DRAINING, waiting for %d requests", rep.State, rep.Evidence, lane)
				}
				time.Sleep(50 * time.Millisecond)
			}
			srv.release()
			res := p.wait(t)
			if res.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s", res.code, tt.code, res)
			}
			for _, w := range append(tt.say, "regen: job own done: ") {
				if !strings.Contains(res.stdout+res.stderr, w) {
					t.Errorf("run does not say %q:\n%s", w, res)
				}
			}
			if strings.Contains(res.stderr, "interrupted") {
				t.Errorf("a finished job called interrupted:\n%s", res)
			}
			out := filepath.Join(dir, "out")
			if got := len(readJSONL(t, filepath.Join(out, "own.sharegpt.jsonl"))); got != tt.done {
				t.Errorf("training file: %d rows, want %d", got, tt.done)
			}
			if got := len(readJSONL(t, filepath.Join(out, "own.rejected.jsonl"))); got != tt.reject {
				t.Errorf("rejected file: %d rows, want %d", got, tt.reject)
			}
			rep, sres := status(t, dir, "job.yaml")
			if rep.State != monitor.Done || sres.code != 0 || rep.Total.Done != tt.done || rep.Total.Rejected != tt.reject {
				t.Errorf("status: %s exit %d, %+v; want DONE exit 0 with %d done, %d rejected\n%s",
					rep.State, sres.code, rep.Total, tt.done, tt.reject, sres)
			}
		})
	}
}
