package monitor

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestStoreHealth drives the store's health through an outage with a fake
// clock: reads never end it (the caller does not report them), a write
// does; the periodic writes back off to StoreRetryMax; the outage is
// logged at its start and then at doubling intervals; a store that flaps
// logs one start a minute and counts the others.
func TestStoreHealth(t *testing.T) {
	full := errors.New("database or disk is full")
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	var h StoreHealth
	if !h.Due(t0) {
		t.Fatal("due while up = false, want true")
	}
	if got := h.Failed(full, t0); got.Kind != LogStarted {
		t.Fatalf("first failure logs %v, want LogStarted", got.Kind)
	}

	// Retry the periodic writes whenever due, for an hour, failing each time.
	var tries []time.Duration
	var lines []time.Duration
	for now := t0; now.Sub(t0) < time.Hour; now = now.Add(100 * time.Millisecond) {
		if !h.Due(now) {
			continue
		}
		tries = append(tries, now.Sub(t0))
		if l := h.Failed(full, now); l.Kind == LogStillDown {
			lines = append(lines, now.Sub(t0))
		}
	}
	wantStart := []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 3500 * time.Millisecond, 7500 * time.Millisecond, 15500 * time.Millisecond, 25500 * time.Millisecond}
	if diff := cmp.Diff(wantStart, tries[:len(wantStart)]); diff != "" {
		t.Errorf("retry times (-want +got):\n%s", diff)
	}
	if got := len(tries); got > 3600/int(StoreRetryMax.Seconds())+len(wantStart) {
		t.Errorf("%d tries in an hour, want about one per %s", got, StoreRetryMax)
	}
	// Reminders at 1, 3, 7, 15, 31 minutes (gaps 1, 2, 4, 8, 16 min).
	var mins []int
	for _, l := range lines {
		mins = append(mins, int(l.Minutes()))
	}
	if diff := cmp.Diff([]int{1, 3, 7, 15, 31}, mins); diff != "" {
		t.Errorf("minutes of the 'still down' lines (-want +got):\n%s", diff)
	}

	end := t0.Add(time.Hour)
	if got := h.Wrote(end); !got.Ended || !got.Logged || got.DownFor != time.Hour || got.Cause != full.Error() {
		t.Errorf("wrote after an hour = %+v, want a logged end after 1h with the cause", got)
	}
	if cause, _ := h.State(); cause != "" || !h.Due(end) {
		t.Errorf("after the write: state %q, due %v; want up and due", cause, h.Due(end))
	}

	// Flapping: one write fails, the next passes, every second. Only the
	// first outage of the minute is logged (start and end); the next line
	// says how many were not.
	var started, endsLogged int
	now := end
	for i := range 120 {
		now = end.Add(time.Duration(i) * time.Second)
		l := h.Failed(full, now)
		if l.Kind == LogStarted {
			started++
			if started == 2 && l.Unlogged != 59 {
				t.Errorf("second logged start says %d outages not logged, want 59", l.Unlogged)
			}
		}
		if e := h.Wrote(now.Add(100 * time.Millisecond)); e.Logged {
			endsLogged++
		}
	}
	if started != 2 || endsLogged != 2 {
		t.Errorf("120 flaps over 2 minutes: %d starts and %d ends logged, want 2 and 2", started, endsLogged)
	}
}
