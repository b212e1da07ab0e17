package runner

import (
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/monitor"
)

// TestMetricsKnowDispatchOutcomes: monitor spells the dispatcher's outcomes
// itself (it does not import dispatch); the runner, which wires one into
// the other, checks that none of dispatch's non-error outcomes is counted
// as an error and that an error class still is.
func TestMetricsKnowDispatchOutcomes(t *testing.T) {
	m := monitor.NewMetrics(nil)
	for _, o := range dispatch.NotErrors {
		m.ObserveRequest("short", "http://a", o, time.Second, 0, 0)
	}
	errorClass := llm.ServerDown.String()
	m.ObserveRequest("short", "http://a", errorClass, time.Second, 0, 0)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	errs := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "regen_errors_total" {
			continue
		}
		for _, metric := range f.Metric {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "class" {
					errs[l.GetValue()] += metric.GetCounter().GetValue()
				}
			}
		}
	}
	if len(errs) != 1 || errs[errorClass] != 1 {
		t.Errorf("regen_errors_total by class %v after %v and one %s; want only the %s", errs, dispatch.NotErrors, errorClass, errorClass)
	}
}
