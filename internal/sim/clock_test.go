package sim

import (
	"io"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricClock reads the simulated clock from the server's /metrics.
func metricClock(t *testing.T, s *Server) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	f, ok := fams[ClockMetric]
	if !ok || len(f.GetMetric()) == 0 {
		t.Fatalf("/metrics has no %s", ClockMetric)
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

// An idle server's clock on /metrics reads the present: a scrape after a
// wait sees the wait, scaled by the speed, and the first request after it
// does not make the clock jump back or forward. (It used to read the time
// of the scheduler's last step, so a server idle before a job counted its
// whole wait as the job's time at the first request: bench/sweep's cells
// on several servers measured up to twice their simulated time.)
func TestClockOnMetricsAdvancesWhileIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Speed = 10
		s, err := New(cfg, io.Discard)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer s.Close()
		synctest.Wait()
		start := metricClock(t, s)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if got, want := metricClock(t, s)-start, 300.0; got != want {
			t.Errorf("clock advanced %gs over 30s idle at speed 10, want %gs", got, want)
		}
		idle := metricClock(t, s)
		p := s.probe(8)
		for !p.done.Load() {
			<-p.notify
		}
		synctest.Wait()
		busy := metricClock(t, s)
		if busy <= idle || busy > idle+1 {
			t.Errorf("clock after an 8-token request %gs, want just above %gs (no jump)", busy, idle)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got, want := metricClock(t, s)-busy, 100.0; got < want-1e-9 || got > want+1 {
			t.Errorf("clock advanced %gs over 10s idle after a request, want about %gs", got, want)
		}
	})
}
