package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestAssess(t *testing.T) {
	ctx := context.Background()
	t0 := time.Now()
	host, _ := os.Hostname()
	beat := func(s State, exited bool, reason string) []byte {
		b, _ := json.Marshal(Beat{State: s, Exited: exited, ExitReason: reason, Evidence: []string{"because"}})
		return b
	}
	tests := []struct {
		name     string
		hb       *store.Heartbeat
		finish   int // samples of 4 completed
		now      time.Time
		want     State
		evidence string
	}{
		{name: "never run", now: t0, want: Dead, evidence: "no runner has ever"},
		{name: "live runner", now: t0, want: Running,
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: host, Time: t0, Counters: beat(Running, false, "")}},
		{name: "live runner says stalled", now: t0, want: Stalled, evidence: "because",
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: host, Time: t0, Counters: beat(Stalled, false, "")}},
		{name: "heartbeat too old", now: t0.Add(time.Minute), want: Dead, evidence: "last heartbeat 1m0s ago",
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: "elsewhere", Time: t0, Counters: beat(Running, false, "")}},
		{name: "fresh heartbeat but process gone", now: t0, want: Dead, evidence: "no longer exists",
			hb: &store.Heartbeat{Owner: "o", PID: deadPID(t), Host: host, Time: t0, Counters: beat(Running, false, "")}},
		{name: "interrupted", now: t0, want: Stopped, evidence: "interrupted",
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: host, Time: t0, Counters: beat(Running, true, "interrupted")}},
		{name: "failed", now: t0, want: Failed, evidence: "cuda_oom",
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: host, Time: t0, Counters: beat(Failed, true, "cuda_oom")}},
		{name: "finished and exported, runner long gone", finish: 4, now: t0.Add(time.Hour), want: Done, evidence: "all 4 samples",
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: host, Time: t0, Counters: beat(Done, true, ExitFinished)}},
		{name: "finished but runner died before exporting", finish: 4, now: t0.Add(time.Hour), want: Dead, evidence: "before exporting",
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: "elsewhere", Time: t0, Counters: beat(Running, false, "")}},
		{name: "finished, runner still exporting", finish: 4, now: t0, want: Running,
			hb: &store.Heartbeat{Owner: "o", PID: os.Getpid(), Host: host, Time: t0, Counters: beat(Running, false, "")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var samples []store.NewSample
			for _, id := range []string{"a", "b", "c", "d"} {
				samples = append(samples, store.NewSample{ID: id, Partition: "p", Lane: "short", Body: []byte(`{}`)})
			}
			if _, err := st.Ingest(ctx, samples); err != nil {
				t.Fatal(err)
			}
			if tt.finish > 0 {
				claimed, err := st.Claim(ctx, "short", tt.finish, "w", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range claimed {
					if err := st.Complete(ctx, c.ID, "w", store.Result{Response: []byte(`{}`), FinishReason: "stop", CompletionTokens: 10}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tt.hb != nil {
				if err := st.PutHeartbeat(ctx, *tt.hb); err != nil {
					t.Fatal(err)
				}
			}
			r, err := Assess(ctx, st, AssessOptions{Now: tt.now, DeadAfter: 15 * time.Second, Host: host})
			if err != nil {
				t.Fatalf("Assess: %v", err)
			}
			if r.State != tt.want {
				t.Fatalf("state = %s (%v), want %s", r.State, r.Evidence, tt.want)
			}
			if r.ExitCode != ExitCode(tt.want) {
				t.Errorf("exit code = %d, want %d", r.ExitCode, ExitCode(tt.want))
			}
			if tt.evidence != "" && !strings.Contains(strings.Join(r.Evidence, "\n"), tt.evidence) {
				t.Errorf("evidence %q does not mention %q", r.Evidence, tt.evidence)
			}
			if r.Total.Total != 4 || r.Total.Done != tt.finish || r.Total.Pending != 4-tt.finish {
				t.Errorf("totals = %+v", r.Total)
			}
		})
	}
}

// noListStore refuses to list bad source rows: status must count them,
// since listing them all is O(source rows) memory.
type noListStore struct{ store.Store }

func (noListStore) IngestErrors(context.Context, int) ([]store.IngestError, error) {
	return nil, errors.New("status listed every bad source row")
}

func TestAssessCountsBadRows(t *testing.T) {
	ctx := context.Background()
	bad := func(from, to int) []store.IngestError {
		var out []store.IngestError
		for i := from; i < to; i++ {
			out = append(out, store.IngestError{Partition: "p", Origin: fmt.Sprintf("in.jsonl:%d", i), Field: "input", Reason: "missing"})
		}
		return out
	}
	tests := []struct {
		name    string
		batches [][]store.IngestError
		want    int
	}{
		{name: "none", want: 0},
		{name: "one batch", batches: [][]store.IngestError{bad(0, 3)}, want: 3},
		{name: "re-ingested rows counted once", batches: [][]store.IngestError{bad(0, 3), bad(2, 5)}, want: 5},
		{name: "every row of a big source", batches: [][]store.IngestError{bad(0, 1500), bad(1500, 2500)}, want: 2500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			for _, b := range tt.batches {
				if err := st.AddIngestErrors(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			r, err := Assess(ctx, noListStore{st}, AssessOptions{Now: time.Now(), DeadAfter: 15 * time.Second})
			if err != nil {
				t.Fatalf("Assess: %v", err)
			}
			if r.IngestErrors != tt.want {
				t.Errorf("IngestErrors = %d, want %d", r.IngestErrors, tt.want)
			}
		})
	}
}

// TestAssessAgesLoad: the report gives each endpoint's server reading its
// age at the report's time, and its JSON says when it is older than the
// probe interval it was taken at.
func TestAssessAgesLoad(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	kv, running := 0.0, 1.0
	for _, c := range []struct {
		age   time.Duration
		stale bool
	}{{2 * time.Second, false}, {30 * time.Second, true}} {
		b, _ := json.Marshal(Beat{State: Running, Endpoints: []EndpointStatus{{URL: "http://e", State: Ready, InFlight: 182,
			Load: &Load{At: now.Add(-c.age), Every: 5 * time.Second, KVUsage: &kv, Running: &running}}}})
		if err := st.PutHeartbeat(ctx, store.Heartbeat{Owner: "w", PID: 1, Host: "elsewhere", Time: now, Started: now.Add(-time.Hour), Counters: b}); err != nil {
			t.Fatal(err)
		}
		r, err := Assess(ctx, st, AssessOptions{Job: "j", Now: now, DeadAfter: time.Minute})
		if err != nil || len(r.Endpoints) != 1 || r.Endpoints[0].Load == nil {
			t.Fatalf("assess: %+v, %v", r.Endpoints, err)
		}
		js, _ := json.Marshal(r.Endpoints[0].Load)
		var doc struct {
			AgeSeconds float64 `json:"age_seconds"`
			Stale      bool    `json:"stale"`
		}
		if err := json.Unmarshal(js, &doc); err != nil || r.Endpoints[0].Load.Age != c.age || doc.AgeSeconds != c.age.Seconds() || doc.Stale != c.stale {
			t.Errorf("reading %s old: age %s, JSON %s; want age %s, stale %v", c.age, r.Endpoints[0].Load.Age, js, c.age, c.stale)
		}
	}
}
