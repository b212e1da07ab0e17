package stats

import "time"

// MaxPoints is the most buckets a time series is drawn with: the charts,
// the terminal's sparklines and `regen stats` all cut the job's span into
// at most this many.
const MaxPoints = 60

// Slot is the finest step the history the runner writes has: five seconds
// while a run is younger than SlotFineFor, whole minutes after (a job of
// days keeps one row per minute, a new one is seen second by second).
const (
	Slot        = 5 * time.Second
	SlotCoarse  = time.Minute
	SlotFineFor = time.Hour
)

// steps are the bucket widths a series may use, finest first; each is a
// whole multiple of the ones before it that divide a minute, so buckets
// of a width fold rows of any finer slot exactly.
var steps = []time.Duration{
	time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// Axis is the time axis of a series: Buckets buckets of width Bucket
// ending at End, the end of the slot holding the last reading, so the
// series starts where the job started and fills its width.
type Axis struct {
	Start   time.Time
	End     time.Time
	Bucket  time.Duration
	Buckets int
	// From is the job's first reading (Start when zero or earlier): the
	// first bucket's rate is over the part of it the job ran.
	From time.Time
}

// Window is the time the axis spans.
func (a Axis) Window() time.Duration { return a.End.Sub(a.Start) }

// AxisFor is the one rule that chooses a series' window and bucket from
// the job's span, first..last (last is now for a running job): the
// finest bucket, no finer than the data's slot, that cuts the span into
// at most MaxPoints, and at least two. Buckets end where the slot holding
// last ends, and
// every width is a multiple of the slots (5 s, 1 min) a row can have, so
// a row never straddles two buckets and the last bucket is the most
// recent stretch of that width.
func AxisFor(first, last time.Time, slot time.Duration) Axis {
	if last.Before(first) {
		last = first
	}
	end := last.Truncate(slot).Add(slot)
	span := end.Sub(first.Truncate(slot))
	b := steps[len(steps)-1]
	for _, s := range steps {
		if s >= slot && span <= s*MaxPoints {
			b = s
			break
		}
	}
	// Two buckets at least: a chart of one point has no line and no width.
	n := max(int((span+b-1)/b), 2)
	return Axis{Start: end.Add(-time.Duration(n) * b), End: end, Bucket: b, Buckets: n, From: first}
}

// NowWindow is what "now" means for a rate: the last minute, the last
// bucket of a one-minute axis ending where AxisFor's do. Once a run's
// rows are whole minutes, it is the last two (the current one alone
// would be a few seconds old at every minute's start).
func NowWindow(slot time.Duration) time.Duration { return max(time.Minute, 2*slot) }

// NowAxis is the one-bucket axis of the "now" rate at time now, for a
// run started at started (a younger run's rate is over its life).
func NowAxis(now, started time.Time, slot time.Duration) Axis {
	end := now.Truncate(slot).Add(slot)
	w := NowWindow(slot)
	return Axis{Start: end.Add(-w), End: end, Bucket: w, Buckets: 1, From: started}
}

// Index is the bucket t falls in, or -1 outside the axis.
func (a Axis) Index(t time.Time) int {
	if t.Before(a.Start) || !t.Before(a.End) {
		return -1
	}
	return int(t.Sub(a.Start) / a.Bucket)
}

// PerSecond is the one definition of a per-bucket rate: what was counted
// in bucket i over the seconds of it the job covered, from its first
// reading (From) to now: a whole bucket once it is over, the elapsed part
// of the current one, the running part of the first; at least a second,
// so a bucket just begun does not divide by zero.
func (a Axis) PerSecond(n float64, i int, now time.Time) float64 {
	lo := a.Start.Add(time.Duration(i) * a.Bucket)
	hi := lo.Add(a.Bucket)
	if a.From.After(lo) {
		lo = a.From
	}
	if now.Before(hi) {
		hi = now
	}
	return n / max(hi.Sub(lo).Seconds(), 1)
}

// SlotAt is the slot (start and width) of the runner's history row for
// time t of a run started at started: fine while the run is young; the
// switch happens on a minute boundary, so a fine row and a coarse row
// never share a start.
func SlotAt(t, started time.Time) (time.Time, time.Duration) {
	w := SlotWidth(t, started)
	return t.Truncate(w), w
}

// SlotWidth is the width of the runner's rows at time t of a run started
// at started (zero: unknown, taken as young).
func SlotWidth(t, started time.Time) time.Duration {
	if started.IsZero() || t.Truncate(SlotCoarse).Sub(started) < SlotFineFor {
		return Slot
	}
	return SlotCoarse
}
