package stats

import (
	"testing"
	"time"
)

// TestAxisFor: the one rule for every chart, sparkline and `regen stats`:
// the window follows the job (it starts where the job did, whatever its
// age) and the bucket is the finest that keeps at most MaxPoints, never
// finer than the data's slot; the last bucket ends with the slot of the
// last reading.
func TestAxisFor(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name        string
		span        time.Duration
		slot        time.Duration
		wantBucket  time.Duration
		wantBuckets int
	}{
		{"21 s job, answers by the second", 21 * time.Second, time.Second, time.Second, 22},
		{"a minute-old job, runner rows", time.Minute, Slot, Slot, 13},
		{"five minutes", 5 * time.Minute, Slot, 10 * time.Second, 31},
		{"forty minutes", 40 * time.Minute, Slot, time.Minute, 41},
		{"two hours", 2 * time.Hour, time.Minute, 5 * time.Minute, 25},
		{"two hours, fine rows", 2 * time.Hour, Slot, 5 * time.Minute, 25},
		{"three days", 72 * time.Hour, time.Minute, 2 * time.Hour, 37},
		{"a month", 30 * 24 * time.Hour, time.Minute, 24 * time.Hour, 31},
		{"nothing yet: two buckets, so a chart has a line", 0, Slot, Slot, 2},
		{"three seconds", 3 * time.Second, Slot, Slot, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			last := t0.Add(c.span)
			a := AxisFor(t0, last, c.slot)
			if a.Bucket != c.wantBucket || a.Buckets != c.wantBuckets {
				t.Errorf("AxisFor(%s, slot %s) = %d buckets of %s, want %d of %s", c.span, c.slot, a.Buckets, a.Bucket, c.wantBuckets, c.wantBucket)
			}
			if a.Buckets > MaxPoints {
				t.Errorf("%d buckets, more than %d", a.Buckets, MaxPoints)
			}
			// The job's first and last readings are on the axis, the first
			// in the first bucket: the series fills the width.
			if a.Index(t0) != 0 && a.Buckets > 2 || a.Index(t0) < 0 || a.Index(last.Truncate(c.slot)) != a.Buckets-1 {
				t.Errorf("start in bucket %d, last in %d of %d; want 0 and the last", a.Index(t0), a.Index(last.Truncate(c.slot)), a.Buckets)
			}
			if a.End.Sub(a.Start) != time.Duration(a.Buckets)*a.Bucket || a.Bucket%c.slot != 0 {
				t.Errorf("axis %+v: window is not whole buckets of a multiple of the slot", a)
			}
		})
	}
}

// TestPerSecond: a bucket's rate is over its length, or over the part of
// it the job covered: the elapsed part of the current bucket, the part
// after the job's first reading of the first one; at least a second.
func TestPerSecond(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	a := Axis{Start: t0, End: t0.Add(2 * time.Minute), Bucket: time.Minute, Buckets: 2}
	late := a
	late.From = t0.Add(40 * time.Second)
	for _, c := range []struct {
		name string
		a    Axis
		i    int
		now  time.Time
		want float64
	}{
		{"over", a, 0, t0.Add(time.Hour), 1},
		{"half elapsed", a, 0, t0.Add(30 * time.Second), 2},
		{"just begun", a, 0, t0, 60},
		{"job began 40 s in", late, 0, t0.Add(time.Hour), 3},
		{"second bucket, job began in the first", late, 1, t0.Add(time.Hour), 1},
		{"job began 40 s in, now 50 s in", late, 0, t0.Add(50 * time.Second), 6},
	} {
		if got := c.a.PerSecond(60, c.i, c.now); got != c.want {
			t.Errorf("%s: PerSecond(60, bucket %d) = %v, want %v", c.name, c.i, got, c.want)
		}
	}
}

// TestSlotWidth: five-second rows in a run's first hour, minutes after,
// switching on a minute boundary.
func TestSlotWidth(t *testing.T) {
	started := time.Date(2026, 12, 4, 6, 0, 30, 0, time.UTC)
	for _, c := range []struct {
		at   time.Duration
		want time.Duration
	}{
		{0, Slot}, {59 * time.Minute, Slot}, {time.Hour, Slot}, {time.Hour + 31*time.Second, SlotCoarse}, {48 * time.Hour, SlotCoarse},
	} {
		if got := SlotWidth(started.Add(c.at), started); got != c.want {
			t.Errorf("slot %s into the run = %s, want %s", c.at, got, c.want)
		}
	}
	if got := SlotWidth(started, time.Time{}); got != Slot {
		t.Errorf("slot of an unknown start = %s, want %s", got, Slot)
	}
}
