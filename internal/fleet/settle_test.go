package fleet

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestBreakerVerdictSettlesFromItsStart: a killed server's requests fail
// first mid-stream, then at connect. The breaker's DOWN is shown once it
// has lasted breakerSettle from its first sighting, with the latest cause,
// and DOWN since that first sighting: a new wording of the same outage
// does not restart the wait.
func TestBreakerVerdictSettlesFromItsStart(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	record := func(ctx context.Context, e store.Event) {
		if err := st.AddEvent(ctx, e); err != nil {
			t.Errorf("record event: %v", err)
		}
	}
	r := &Fleet{cfg: Config{Spec: &job.Spec{Name: "j"}, Report: Reporter{Event: record}}, log: slog.New(slog.DiscardHandler),
		shown: map[string]monitor.EndpointStatus{}, overruled: map[string]monitor.EndpointStatus{}}
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	const url = "http://127.0.0.1:1"
	raw := monitor.EndpointStatus{URL: url, State: monitor.Ready, Since: t0}
	down := func(cause string) monitor.EndpointStatus {
		return monitor.EndpointStatus{URL: url, State: monitor.Down, Cause: cause}
	}
	eof, refused := "requests fail: chat stream: unexpected EOF", "requests fail: connect: connection refused"

	if got := r.settle(ctx, raw, raw, t0); got.State != monitor.Ready || !got.Since.Equal(t0) {
		t.Fatalf("first sighting: %s since %s, want READY since %s", got.State, got.Since, t0)
	}
	first := t0.Add(100 * time.Millisecond)
	for _, step := range []struct {
		at    time.Time
		cause string
	}{{first, eof}, {t0.Add(900 * time.Millisecond), refused}} {
		if got := r.settle(ctx, raw, down(step.cause), step.at); got.State != monitor.Ready {
			t.Fatalf("at +%s, before the verdict lasted %s: shown %s, want READY still", step.at.Sub(t0), breakerSettle, got.State)
		}
	}
	got := r.settle(ctx, raw, down(refused), first.Add(breakerSettle))
	if got.State != monitor.Down || got.Cause != refused || !got.Since.Equal(first) {
		t.Fatalf("%s after the first failure: %s (%s) since %s; want DOWN (%s) since %s",
			breakerSettle, got.State, got.Cause, got.Since, refused, first)
	}
	evs, err := st.Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Kind != "breaker" || evs[0].State != "DOWN" || !evs[0].Time.Equal(first) {
		t.Errorf("events %+v, want one breaker DOWN at %s", evs, first)
	}
}
