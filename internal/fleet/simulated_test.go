package fleet

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
)

// The simulator's hidden-state folder in a job's server.sim block is
// relative to the job file, as every path in it is.
func TestSimHiddenStatesRelativeToJob(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ in, want string }{
		{"hs", filepath.Join(dir, "jobs", "hs")},
		{"/abs/hs", "/abs/hs"},
	} {
		spec := &job.Spec{Path: filepath.Join(dir, "jobs", "job.yaml")}
		spec.Server = &job.Server{Sim: map[string]any{"engine": "vllm", "hidden_states": tt.in}}
		f, err := newSimFleet(spec, dir, slog.New(slog.DiscardHandler), func(context.Context, monitor.EndpointStatus, monitor.EndpointStatus) {})
		if err != nil {
			t.Fatal(err)
		}
		f.logFile.Close()
		if f.cfg.HiddenStates != tt.want {
			t.Errorf("hidden_states %q: the simulator writes to %q, want %q", tt.in, f.cfg.HiddenStates, tt.want)
		}
	}
}
