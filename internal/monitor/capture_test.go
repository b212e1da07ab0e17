package monitor

import (
	"context"
	"testing"

	"github.com/regen-dev/regen/internal/store"
)

// captureStore is a CaptureReader with fixed counts and meta.
type captureStore struct {
	counts store.CaptureCounts
	meta   map[string]string
}

func (c captureStore) CaptureCounts(context.Context) (store.CaptureCounts, error) {
	return c.counts, nil
}
func (c captureStore) Meta(_ context.Context, k string) (string, bool, error) {
	v, ok := c.meta[k]
	return v, ok, nil
}

// TestReadCapture: the counts come from the store's capture table, the
// total from what the capture's walk recorded, and the views' line says
// both; without a recorded total it says the total is not counted yet.
func TestReadCapture(t *testing.T) {
	ctx := context.Background()
	counts := store.CaptureCounts{Captured: 1234, Dead: 3, Leased: 4, Pending: 5, Bytes: 12_300_000_000, Tokens: 1_234_567}
	p, err := ReadCapture(ctx, captureStore{counts: counts, meta: map[string]string{CaptureRowsMeta: "2000"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Total == nil || *p.Total != 2000 || p.Captured != 1234 || p.Dead != 3 || p.InFlight != 4 || p.Pending != 5 || p.Bytes != 12_300_000_000 {
		t.Fatalf("ReadCapture = %+v", p)
	}
	if got, want := p.Text(), "1,234 of 2,000 captured (61.7%), 3 dead, 4 in flight, 5 to retry; 12 GB, 1,234,567 tokens"; got != want {
		t.Errorf("Text() = %q, want %q", got, want)
	}
	p, err = ReadCapture(ctx, captureStore{counts: store.CaptureCounts{Captured: 7, Bytes: 999}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Text(), "7 captured (total not counted yet), 0 dead, 0 in flight; 999 B, 0 tokens"; p.Total != nil || got != want {
		t.Errorf("without a total: Text() = %q (total %v), want %q", got, p.Total, want)
	}
}

func TestSize(t *testing.T) {
	for b, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 kB", 1_048_576: "1.0 MB", 412_000_000_000: "412 GB", 1_299_000_000_000: "1.3 TB", 99_999: "100 kB"} {
		if got := Size(b); got != want {
			t.Errorf("Size(%d) = %q, want %q", b, got, want)
		}
	}
}

// TestCaptureMetrics: /metrics serves the capture's files by state, the
// total and the bytes for a job that captures, and nothing of it for one
// that does not.
func TestCaptureMetrics(t *testing.T) {
	total := 10
	for _, c := range []struct {
		capture *CaptureProgress
		want    map[string]float64
	}{
		{&CaptureProgress{Total: &total, Captured: 6, Dead: 1, InFlight: 2, Pending: 1, Bytes: 4096, Tokens: 300},
			map[string]float64{"captured": 6, "dead": 1, "in_flight": 2, "pending": 1, "rows": 10, "bytes": 4096, "tokens": 300}},
		{nil, map[string]float64{}},
	} {
		m := NewMetrics(func(context.Context) (Report, error) { return Report{State: Running, Capture: c.capture}, nil })
		families, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range families {
			for _, metric := range f.Metric {
				switch f.GetName() {
				case "regen_capture_files_total":
					got[label(metric, "state")] = metric.GetGauge().GetValue()
				case "regen_capture_rows":
					got["rows"] = metric.GetGauge().GetValue()
				case "regen_capture_bytes_total":
					got["bytes"] = metric.GetCounter().GetValue()
				case "regen_capture_tokens_total":
					got["tokens"] = metric.GetCounter().GetValue()
				}
			}
		}
		if len(got) != len(c.want) {
			t.Errorf("capture %+v: metrics %v, want %v", c.capture, got, c.want)
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("capture %+v: %s = %v, want %v", c.capture, k, got[k], v)
			}
		}
	}
}
