package monitor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEvaluate(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ready := EndpointStatus{URL: "http://a", State: Ready}
	tests := []struct {
		name string
		live Live
		want State
	}{
		{"nothing left", Live{Now: t0, Remaining: 0}, Done},
		{"tokens flowing", Live{Now: t0, StartedAt: t0.Add(-time.Hour), Endpoints: []EndpointStatus{ready},
			Remaining: 10, InFlight: 5, LastTokenAt: t0.Add(-time.Second), StallAfter: time.Minute}, Running},
		{"silent too long", Live{Now: t0, StartedAt: t0.Add(-time.Hour), Endpoints: []EndpointStatus{ready},
			Remaining: 10, InFlight: 5, LastTokenAt: t0.Add(-2 * time.Minute), StallAfter: time.Minute}, Stalled},
		{"never a token since start", Live{Now: t0, StartedAt: t0.Add(-2 * time.Minute), Endpoints: []EndpointStatus{ready},
			Remaining: 10, StallAfter: time.Minute}, Stalled},
		{"young run without tokens yet", Live{Now: t0, StartedAt: t0.Add(-10 * time.Second), Endpoints: []EndpointStatus{ready},
			Remaining: 10, StallAfter: time.Minute}, Running},
		{"only endpoint down", Live{Now: t0, Endpoints: []EndpointStatus{{URL: "a", State: Down, Cause: "exit 137"}}, Remaining: 3}, Down},
		{"only endpoint restarting", Live{Now: t0, Endpoints: []EndpointStatus{{URL: "a", State: Restarting}}, Remaining: 3}, Restarting},
		{"only endpoint failed", Live{Now: t0, Endpoints: []EndpointStatus{{URL: "a", State: Failed}}, Remaining: 3}, Failed},
		{"one of two down, other serving", Live{Now: t0, StartedAt: t0, Endpoints: []EndpointStatus{ready, {URL: "b", State: Down}},
			Remaining: 3, LastTokenAt: t0, StallAfter: time.Minute}, Running},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ev := Evaluate(tt.live)
			if got != tt.want {
				t.Fatalf("Evaluate() = %s (%v), want %s", got, ev, tt.want)
			}
			if got != Running && got != Done && len(ev) == 0 {
				t.Errorf("Evaluate() = %s without evidence", got)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	for s, want := range map[State]int{Running: 0, Done: 0, Stalled: 1, Down: 1, Restarting: 1, Dead: 2, Failed: 2, Stopped: 2} {
		if got := ExitCode(s); got != want {
			t.Errorf("ExitCode(%s) = %d, want %d", s, got, want)
		}
	}
}

func TestAlerterFiresCommandAndWebhook(t *testing.T) {
	var got Transition
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Errorf("webhook body: %v", err)
		}
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "alert.txt")
	a := &Alerter{Command: []string{"sh", "-c", `printf '%s %s %s' "$REGEN_FROM" "$REGEN_STATE" "$REGEN_SUBJECT" > ` + out}, Webhook: srv.URL}
	tr := Transition{Job: "demo", Subject: "job", From: Running, To: Stalled, Time: time.Now(), Evidence: []string{"no token for 31s"}}
	if err := a.Notify(context.Background(), tr); err != nil {
		t.Fatalf("Notify: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("command did not run: %v", err)
	}
	if string(b) != "RUNNING STALLED job" {
		t.Errorf("command saw %q, want %q", b, "RUNNING STALLED job")
	}
	if got.To != Stalled || got.Evidence[0] != "no token for 31s" {
		t.Errorf("webhook got %+v", got)
	}
}

func TestAlerterSkipsCalmTransitionsAndReportsFailures(t *testing.T) {
	a := &Alerter{Command: []string{"sh", "-c", "exit 3"}}
	if a.Wants(Transition{From: Starting, To: Running}) {
		t.Error("STARTING->RUNNING should not alert")
	}
	if !a.Wants(Transition{From: Down, To: Running}) {
		t.Error("leaving DOWN should alert")
	}
	err := a.Notify(context.Background(), Transition{From: Running, To: Down})
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Notify error = %v, want the command's exit status", err)
	}
}

func TestEvaluateFirstStartIsNotARestart(t *testing.T) {
	t0 := time.Now()
	got, _ := Evaluate(Live{Now: t0, Endpoints: []EndpointStatus{{URL: "a", State: Starting}}, Remaining: 3})
	if got != Starting {
		t.Errorf("first start = %s, want STARTING", got)
	}
	got, _ = Evaluate(Live{Now: t0, Endpoints: []EndpointStatus{{URL: "a", State: Starting, Restarts: 1}}, Remaining: 3})
	if got != Restarting {
		t.Errorf("start after a failure = %s, want RESTARTING", got)
	}
}
