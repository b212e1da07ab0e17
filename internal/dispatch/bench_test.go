package dispatch

import (
	"context"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
)

// BenchmarkRun measures the dispatcher's own cost per sample: instant fake
// endpoints and the in-memory fake store (whose Claim scans all samples, so
// this is an upper bound on the dispatcher's share).
func BenchmarkRun(b *testing.B) {
	const n = 1000
	instant := func(_ context.Context, c call1) (llm.Result, error) {
		c.onDelta(1)
		return llm.Result{Content: "x", FinishReason: "stop"}, nil
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		st := newFakeStore()
		st.add("short", "s", n)
		eps, _ := fleet(newTracker(), instant, "http://a", "http://b", "http://c", "http://d")
		cfg := baseConfig(st, eps)
		cfg.Lanes[0].Concurrency = 64
		d, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := d.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sample")
}
