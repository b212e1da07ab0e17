package monitor

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Requests sent back to pending without spending an attempt (cancelled,
// moved, shed), and backups cancelled as unneeded, are counted by outcome
// and never as errors.
func TestReleasedRequestsAreNotErrors(t *testing.T) {
	m := NewMetrics(nil)
	for _, o := range []string{outcomeCancelled, outcomeMoved, outcomeShed, outcomeShed, outcomeUnneeded, "server-down"} {
		m.ObserveRequest("short", "http://a", o, time.Second, 0, 0)
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	requests, errs := map[string]float64{}, map[string]float64{}
	for _, f := range families {
		for _, metric := range f.Metric {
			switch f.GetName() {
			case "regen_requests_total":
				requests[label(metric, "outcome")] = metric.GetCounter().GetValue()
			case "regen_errors_total":
				errs[label(metric, "class")] = metric.GetCounter().GetValue()
			}
		}
	}
	if requests["shed"] != 2 || requests["moved"] != 1 || requests["cancelled"] != 1 || requests["unneeded"] != 1 || requests["server-down"] != 1 {
		t.Errorf("regen_requests_total by outcome %v, want shed 2, moved 1, cancelled 1, unneeded 1, server-down 1", requests)
	}
	if len(errs) != 1 || errs["server-down"] != 1 {
		t.Errorf("regen_errors_total by class %v, want only the server-down one", errs)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestReplaysServed (issue 30 item 8): the keep-alive replays a live
// runner counted per endpoint are served on /metrics.
func TestReplaysServed(t *testing.T) {
	m := NewMetrics(func(context.Context) (Report, error) {
		return Report{State: Running, Endpoints: []EndpointStatus{{URL: "http://a", State: Ready, Replays: 12}}}, nil
	})
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "regen_endpoint_keepalive_replays_total" && len(f.Metric) == 1 &&
			label(f.Metric[0], "endpoint") == "http://a" && f.Metric[0].GetCounter().GetValue() == 12 {
			return
		}
	}
	t.Errorf("/metrics lacks regen_endpoint_keepalive_replays_total{endpoint=\"http://a\"} 12")
}
