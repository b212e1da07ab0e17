package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestAssessWorkers: the job's state across several workers of one store.
func TestAssessWorkers(t *testing.T) {
	ctx := context.Background()
	t0 := time.Now()
	host, _ := os.Hostname()
	type w struct {
		owner, host string
		pid         int
		age         time.Duration
		beat        Beat
	}
	running := Beat{State: Running, Done: 40, Rate: 3.5, Lanes: []string{"short"},
		Endpoints: []EndpointStatus{{URL: "http://127.0.0.1:30000", State: Ready}}}
	down := Beat{State: Down, Evidence: []string{"http://127.0.0.1:30000 DOWN (exit 137)"}}
	tests := []struct {
		name      string
		workers   []w
		finished  bool
		want      State
		evidence  string
		wantLive  int
		wantState map[string]State // owner -> state
	}{
		{name: "one of three down, two running: the job runs", want: Running, evidence: "worker gpu02 pid 2: DOWN",
			workers:  []w{{"a", "gpu01", 1, 0, running}, {"b", "gpu02", 2, time.Second, down}, {"c", "gpu03", 3, 2 * time.Second, running}},
			wantLive: 3, wantState: map[string]State{"a": Running, "b": Down, "c": Running}},
		{name: "a dead worker beside a live one", want: Running,
			workers:  []w{{"a", "gpu01", 1, 0, running}, {"b", "gpu02", 2, time.Minute, running}},
			wantLive: 1, wantState: map[string]State{"a": Running, "b": Dead}},
		{name: "every live worker down", want: Down, evidence: "worker gpu01 pid 1: DOWN",
			workers:  []w{{"a", "gpu01", 1, 0, down}, {"b", "gpu02", 2, time.Second, down}},
			wantLive: 2},
		{name: "all workers dead", want: Dead, evidence: "last heartbeat",
			workers: []w{{"a", "gpu01", 1, time.Minute, running}, {"b", "gpu02", 2, 2 * time.Minute, running}}},
		{name: "exported by one, the other exited after it", finished: true, want: Done,
			workers:   []w{{"b", "gpu02", 2, 0, Beat{Exited: true, ExitReason: ExitFinished}}, {"a", "gpu01", 1, time.Second, Beat{Exited: true, ExitReason: ExitFinished}}},
			wantState: map[string]State{"a": Done, "b": Done}},
		{name: "exported, then a newer worker died", finished: true, want: Dead,
			workers: []w{{"c", "gpu03", 3, time.Minute, running}, {"a", "gpu01", 1, time.Hour, Beat{Exited: true, ExitReason: ExitFinished}}}},
		{name: "same host, process gone", want: Dead, evidence: "no longer exists",
			workers: []w{{"a", host, deadPID(t), 0, running}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if _, err := st.Ingest(ctx, []store.NewSample{{ID: "a", Partition: "p", Lane: "short", Body: []byte(`{}`)}}); err != nil {
				t.Fatal(err)
			}
			if tt.finished {
				c, _ := st.Claim(ctx, "short", 1, "x", time.Minute)
				if err := st.Complete(ctx, c[0].ID, "x", store.Result{FinishReason: "stop"}); err != nil {
					t.Fatal(err)
				}
			}
			for _, w := range tt.workers {
				b, _ := json.Marshal(w.beat)
				if err := st.PutHeartbeat(ctx, store.Heartbeat{Owner: w.owner, PID: w.pid, Host: w.host, Time: t0.Add(-w.age), Started: t0.Add(-time.Hour), Counters: b}); err != nil {
					t.Fatal(err)
				}
			}
			r, err := Assess(ctx, st, AssessOptions{Now: t0, DeadAfter: 15 * time.Second, Host: host})
			if err != nil {
				t.Fatal(err)
			}
			if r.State != tt.want || !strings.Contains(strings.Join(r.Evidence, "\n"), tt.evidence) {
				t.Errorf("state %s evidence %q, want %s with %q", r.State, r.Evidence, tt.want, tt.evidence)
			}
			if len(r.Workers) != len(tt.workers) {
				t.Fatalf("%d workers reported, want %d", len(r.Workers), len(tt.workers))
			}
			live := 0
			for _, rw := range r.Workers {
				if rw.Live {
					live++
				}
				if want, ok := tt.wantState[rw.Owner]; ok && rw.State != want {
					t.Errorf("worker %s: %s, want %s", rw.Owner, rw.State, want)
				}
			}
			if tt.wantLive > 0 && live != tt.wantLive {
				t.Errorf("%d live workers, want %d", live, tt.wantLive)
			}
		})
	}
}

func TestWorkerFieldsFromBeat(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now()
	b, _ := json.Marshal(Beat{State: Running, InFlight: 7, Tokens: 900, Done: 40, Rate: 3.5, Lanes: []string{"short"},
		Endpoints: []EndpointStatus{{URL: "http://127.0.0.1:30000", State: Ready}}})
	if err := st.PutHeartbeat(ctx, store.Heartbeat{Owner: "a", PID: 12, Host: "gpu01", Time: t0.Add(-3 * time.Second), Started: t0.Add(-time.Hour), Counters: b}); err != nil {
		t.Fatal(err)
	}
	r, err := Assess(ctx, st, AssessOptions{Now: t0, DeadAfter: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := r.Workers[0]
	if w.Host != "gpu01" || w.PID != 12 || w.InFlight != 7 || w.Tokens != 900 || w.Done != 40 || w.Rate != 3.5 ||
		w.HeartbeatAge != 3*time.Second || len(w.Endpoints) != 1 || w.Lanes[0] != "short" || !w.Live {
		t.Errorf("worker = %+v", w)
	}
}

func TestStoreDownReport(t *testing.T) {
	r := StoreDown("j", time.Now(), errors.New("dial tcp 10.0.0.5:5432: connect: connection refused"))
	if r.State != Down || r.ExitCode != 1 || r.Store == nil || !strings.Contains(r.Evidence[0], "store unreachable: dial tcp") {
		t.Errorf("StoreDown = %+v", r)
	}
}

func TestForHost(t *testing.T) {
	r := Report{State: Running, Workers: []WorkerStatus{
		{Host: "gpu01", PID: 1, State: Down, Live: true, Evidence: []string{"server exited 137"}},
		{Host: "gpu02", PID: 2, State: Running, Live: true},
		{Host: "gpu03", PID: 3, State: Dead, Evidence: []string{"last heartbeat 1m ago"}},
		{Host: "gpu04", PID: 4, State: Done},
	}}
	for _, tc := range []struct {
		host string
		want State
		code int
	}{
		{"gpu01", Down, 1},
		{"gpu02", Running, 0},
		{"gpu03", Dead, 2},
		{"gpu04", Done, 0},
		{"gpu05", Dead, 2},
	} {
		got := ForHost(r, tc.host)
		if got.State != tc.want || got.ExitCode != tc.code {
			t.Errorf("ForHost(%s) = %s exit %d, want %s exit %d (%v)", tc.host, got.State, got.ExitCode, tc.want, tc.code, got.Evidence)
		}
		for _, w := range got.Workers {
			if w.Host != tc.host {
				t.Errorf("ForHost(%s) kept worker on %s", tc.host, w.Host)
			}
		}
	}
}
