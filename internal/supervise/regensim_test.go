package supervise

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
)

// TestRegenSim supervises the real simulator when REGEN_BIN names a built
// regen binary (go build -o /tmp/regen ./cmd/regen): launch through the sim
// dialect, READY, scrape its metrics, SIGKILL, DOWN, restart, READY.
func TestRegenSim(t *testing.T) {
	bin := os.Getenv("REGEN_BIN")
	if bin == "" {
		t.Skip("REGEN_BIN not set")
	}
	cfg := fastConfig(t)
	d, err := engine.Lookup("sim")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dialect = d
	cfg.Server.Engine = "sim"
	cfg.Server.Command = []string{bin, "sim"}
	cfg.Server.Sim = map[string]any{"kv_tokens": 50000}
	cfg.Server.Restart = job.Restart{Max: 3, Window: time.Minute, Backoff: 20 * time.Millisecond}
	r := start(t, cfg)
	r.rec.waitFor(t, Ready, 1, 20*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for !r.sup.Status().Metrics.Present.Has(engine.FieldMaxTotalTokens) {
		if time.Now().After(deadline) {
			t.Fatalf("no metrics scraped from regen sim: %+v", r.sup.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := r.sup.Status().Metrics.MaxTotalTokens; got != 50000 {
		t.Errorf("max_total_tokens = %v, want 50000 (--kv-tokens)", got)
	}
	pid := r.sup.Status().PID
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	down := r.rec.waitFor(t, Down, 1, 10*time.Second)
	t.Logf("regen sim SIGKILL -> DOWN in %v; argv %q", down.At.Sub(killed), r.sup.Argv())
	r.rec.waitFor(t, Ready, 2, 20*time.Second)
	r.stopAndCheck(t, r.sup.Status().PID)
}
