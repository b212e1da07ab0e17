package monitor

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// TestJudgeStoreNote: a runner's note beside the job makes a stale
// heartbeat DOWN with the store as the cause, only while the note is newer
// than the heartbeat, fresh, and (on this host) its process lives.
func TestJudgeStoreNote(t *testing.T) {
	now := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	hb := store.Heartbeat{Owner: "w1", PID: os.Getpid(), Host: "h", Time: now.Add(-30 * time.Second)}
	note := StoreNote{Owner: "w1", PID: os.Getpid(), Host: "h", Time: now.Add(-time.Second), Since: now.Add(-40 * time.Second), Cause: "database or disk is full"}
	for _, tc := range []struct {
		name string
		note func(n *StoreNote)
		want State
	}{
		{"fresh note of a live runner", func(*StoreNote) {}, Down},
		{"another worker's note", func(n *StoreNote) { n.Owner = "w2" }, Dead},
		{"note older than dead_after", func(n *StoreNote) { n.Time = now.Add(-20 * time.Second) }, Dead},
		{"note older than the heartbeat", func(n *StoreNote) { n.Time = hb.Time.Add(-time.Second) }, Dead},
		{"process gone", func(n *StoreNote) { n.PID = 1 << 30 }, Dead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := note
			tc.note(&n)
			h := hb
			h.PID = n.PID
			o := AssessOptions{Now: now, DeadAfter: 10 * time.Second, Host: "h", StoreNotes: []StoreNote{n}}
			got, ev := judge(Report{}, h, true, Beat{State: Running}, 5, o)
			if got != tc.want {
				t.Fatalf("judge = %s %q, want %s", got, ev, tc.want)
			}
			if got == Down && (!strings.Contains(ev[0], "disk is full") || strings.Contains(strings.Join(ev, " "), "re-run")) {
				t.Errorf("evidence %q: want the store's cause and no re-run", ev)
			}
			ws, err := workers([]store.Heartbeat{h}, o)
			if err != nil {
				t.Fatal(err)
			}
			if ws[0].State != tc.want || ws[0].Live != (tc.want == Down) {
				t.Errorf("worker = %s live %v, want %s live %v", ws[0].State, ws[0].Live, tc.want, tc.want == Down)
			}
		})
	}
}
