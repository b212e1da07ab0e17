package runner

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// writeScript writes an executable shell script into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAlerts kills the server of a job with an alert command: the command
// runs on entering DOWN and on leaving it, with the transition in REGEN_*
// variables. A failing alert command is recorded as an alert_failed event
// and the job still completes.
func TestAlerts(t *testing.T) {
	tests := []struct {
		name string
		// script body; $1 is the file it appends to
		body     string
		failing  bool
		wantSeen []string
	}{
		{
			name:     "command",
			body:     `echo "$REGEN_SUBJECT $REGEN_FROM $REGEN_STATE" >> "$1"` + "\n",
			wantSeen: []string{"READY DOWN", "DOWN RESTARTING"},
		},
		{
			name:    "failing command",
			body:    `echo "$REGEN_SUBJECT $REGEN_FROM $REGEN_STATE" >> "$1"; echo "pager unreachable" >&2; exit 3` + "\n",
			failing: true,
			// the same calls happen; each failure is recorded and ignored
			wantSeen: []string{"READY DOWN", "DOWN RESTARTING"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			seen := filepath.Join(dir, "alerts.txt")
			script := writeScript(t, dir, "alert.sh", tt.body)
			spec := newJob(t, "supervised.yaml.tmpl", faultSamples, jobParams{Alert: []string{script, seen}})
			st := openStore(t, spec)
			r := startRun(t, spec, st, false)
			waitDone(t, r, st, faultSamples/4)
			url := spec.Name // replaced below by the endpoint's URL
			for _, e := range endpointEvents(t, st, time.Time{}) {
				url = e.Subject
			}
			kill(t, serverPID(t, st), syscall.SIGKILL)
			sum, err := r.wait(t, 90*time.Second)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			checkExactlyOnce(t, spec, st, sum, faultSamples, 1)

			b, err := os.ReadFile(seen)
			if err != nil {
				t.Fatalf("alert command never ran: %v", err)
			}
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if rest, ok := strings.CutPrefix(line, url+" "); ok {
					got = append(got, rest)
				} else if !strings.HasPrefix(line, "job ") {
					t.Errorf("alert line %q names neither the endpoint nor the job", line)
				}
			}
			if !slices.Equal(got, tt.wantSeen) {
				t.Errorf("endpoint alerts: got %q, want %q (all lines: %q)", got, tt.wantSeen, string(b))
			}
			var failed []store.Event
			for _, e := range events(t, st) {
				if e.Kind == "alert_failed" {
					failed = append(failed, e)
				}
			}
			switch {
			case tt.failing && len(failed) < len(tt.wantSeen):
				t.Errorf("alert_failed events: got %d, want at least %d", len(failed), len(tt.wantSeen))
			case !tt.failing && len(failed) > 0:
				t.Errorf("alert_failed events: got %v, want none", failed)
			}
			for _, e := range failed {
				if !strings.Contains(e.Evidence, "pager unreachable") {
					t.Errorf("alert_failed evidence %q lacks the command's output", e.Evidence)
				}
			}
		})
	}
}

// TestSlowAlertHook gives the job an alert command that blocks until the
// test releases it. Hooks run beside the job, not inside it: the server is
// restarted and the job finishes (its DONE event is recorded) while the first
// hook is still blocked, and the queued hooks all run once it is released.
func TestSlowAlertHook(t *testing.T) {
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	seen := filepath.Join(dir, "alerts.txt")
	// Short sleeps, so that a killed hook leaves no child holding its output pipe.
	script := writeScript(t, dir, "alert.sh", `while [ ! -e "$1" ]; do sleep 0.05; done
echo "$REGEN_SUBJECT $REGEN_FROM $REGEN_STATE" >> "$2"
`)
	spec := newJob(t, "supervised.yaml.tmpl", faultSamples, jobParams{Alert: []string{script, release, seen}})
	st := openStore(t, spec)
	r := startRun(t, spec, st, true)
	waitDone(t, r, st, faultSamples/4)
	kill(t, serverPID(t, st), syscall.SIGKILL)
	waitFor(t, r, 60*time.Second, "job DONE event while the alert hook blocks", func() bool {
		for _, e := range events(t, st) {
			if e.Kind == "job_state" && e.State == "DONE" {
				return true
			}
		}
		return false
	})
	if _, err := os.Stat(seen); err == nil {
		t.Fatalf("an alert hook finished before it was released")
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.wait(t, 60*time.Second); err != nil {
		t.Fatalf("run: %v", err)
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatalf("queued alerts never ran: %v", err)
	}
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) < 2 {
		t.Errorf("alerts after release: got %q, want at least the DOWN entry and exit", lines)
	}
	for _, e := range events(t, st) {
		if e.Kind == "alert_failed" {
			t.Errorf("alert_failed: %s", e.Evidence)
		}
	}
}
