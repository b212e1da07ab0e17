package web

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/monitor"
)

// TestGrafanaDashboardNames keeps examples/grafana/regen.json honest: it is
// valid JSON and every regen_ metric its queries use is one /metrics serves.
func TestGrafanaDashboardNames(t *testing.T) {
	b, err := os.ReadFile("../../examples/grafana/regen.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("regen.json: %v", err)
	}
	_, report := fixture(t)
	// A job that captures hidden states, so the capture's series are served.
	total := 100
	m := monitor.NewMetrics(func(ctx context.Context) (monitor.Report, error) {
		r, err := report(ctx)
		r.Capture = &monitor.CaptureProgress{Total: &total, Captured: 90, Dead: 1, Bytes: 1 << 30}
		return r, err
	})
	m.ObserveRequest("short", "http://127.0.0.1:1", dispatch.OutcomeOK, time.Second, 100*time.Millisecond, 10)
	m.ObserveRequest("short", "http://127.0.0.1:1", "retryable", time.Second, 0, 0)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, f := range fams {
		served[f.GetName()] = true
	}
	name := regexp.MustCompile(`regen_[a-z_]+`)
	used := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				used++
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suf)
				}
				if !served[base] {
					t.Errorf("panel %q uses %s, which /metrics does not serve", p.Title, n)
				}
			}
		}
	}
	if used < 10 {
		t.Errorf("the dashboard uses only %d regen_ series", used)
	}
}
