package monitor

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/store"
)

// History is the job's series on an axis (stats.AxisFor), summed over
// workers: what the views chart. Rates are per second over the bucket
// (the current bucket over its elapsed part, stats.PerSecond); a gauge is
// null (nil) for a bucket nobody scraped it in.
type History struct {
	Times          []int64           `json:"times"` // unix seconds of each bucket's start
	BucketSeconds  float64           `json:"bucket_seconds"`
	TokensPerSec   []float64         `json:"tokens_per_sec"` // completion tokens of the answers finished
	RequestsPerSec []float64         `json:"requests_per_sec"`
	SamplesPerSec  []float64         `json:"samples_per_sec"`
	ErrorsPerMin   []float64         `json:"errors_per_min"`
	Endpoints      []EndpointHistory `json:"endpoints"`
}

// EndpointHistory is one endpoint's series, aligned with History.Times.
// A gauge is the highest of its readings in the bucket (each reading the
// sum over workers for in-flight and limit, the largest for the server's
// own gauges).
type EndpointHistory struct {
	URL          string     `json:"url"`
	TokensPerSec []float64  `json:"tokens_per_sec"`
	InFlight     []*float64 `json:"in_flight"`
	KVUsage      []*float64 `json:"kv_usage"`
	Queued       []*float64 `json:"queued"`
	Running      []*float64 `json:"running"`
	Limit        []*float64 `json:"limit"`
}

// JobAxis is the axis the views chart a job on: over span (SpanOf), from
// its start to its last heartbeat (the window before it when window > 0),
// by the one rule stats.AxisFor. Without a heartbeat it is the hour to now.
func JobAxis(span RunSpan, ok bool, now time.Time, window time.Duration) stats.Axis {
	last, first := now, now.Add(-time.Hour)
	if ok {
		last, first = span.Ended, span.Started
		if first.IsZero() || first.After(last) {
			first = last
		}
	}
	if window > 0 {
		first = last.Add(-window)
	}
	return stats.AxisFor(first, last, stats.SlotWidth(first, span.Started))
}

// ReadHistory reads the rows on axis a from the store and folds them.
func ReadHistory(ctx context.Context, st store.JournalReader, a stats.Axis, now time.Time) (History, error) {
	rows, err := st.Minutes(ctx, a.Start)
	if err != nil {
		return History{}, fmt.Errorf("read history: %w", err)
	}
	return FoldHistory(rows, a, now), nil
}

// slotKey is one endpoint's readings at one slot, summed over workers.
type slotKey struct {
	url string
	t   time.Time
}

// FoldHistory builds the series on axis a from rows, gaps included.
func FoldHistory(rows []store.Minute, a stats.Axis, now time.Time) History {
	n := max(a.Buckets, 1)
	h := History{Times: make([]int64, n), BucketSeconds: a.Bucket.Seconds(), TokensPerSec: make([]float64, n),
		RequestsPerSec: make([]float64, n), SamplesPerSec: make([]float64, n), ErrorsPerMin: make([]float64, n)}
	start := make([]time.Time, n)
	for i := range n {
		start[i] = a.Start.Add(time.Duration(i) * a.Bucket)
		h.Times[i] = start[i].Unix()
	}
	perSec := func(v float64, i int) float64 { return a.PerSecond(v, i, now) }
	byURL := map[string]*EndpointHistory{}
	slots := map[slotKey]*store.Minute{}
	for _, m := range rows {
		i := a.Index(m.Time)
		if i < 0 {
			continue
		}
		if m.Endpoint == "" {
			h.TokensPerSec[i] += perSec(float64(m.Tokens), i)
			h.RequestsPerSec[i] += perSec(float64(m.Requests), i)
			h.SamplesPerSec[i] += perSec(float64(m.Samples), i)
			h.ErrorsPerMin[i] += perSec(float64(m.Errors), i) * 60
			continue
		}
		e := byURL[m.Endpoint]
		if e == nil {
			e = &EndpointHistory{URL: m.Endpoint, TokensPerSec: make([]float64, n), InFlight: make([]*float64, n),
				KVUsage: make([]*float64, n), Queued: make([]*float64, n), Running: make([]*float64, n), Limit: make([]*float64, n)}
			byURL[m.Endpoint] = e
		}
		e.TokensPerSec[i] += perSec(float64(m.Tokens), i)
		// Several workers: in-flight and limits add up within a slot; the
		// server's own gauges are the same server seen twice, so the
		// largest reading wins.
		k := slotKey{m.Endpoint, m.Time}
		s := slots[k]
		if s == nil {
			s = &store.Minute{Time: m.Time, Endpoint: m.Endpoint, KVUsage: -1, Queued: -1, Running: -1}
			slots[k] = s
		}
		s.InFlight += m.InFlight
		s.Limit += m.Limit
		s.KVUsage, s.Queued, s.Running = max(s.KVUsage, m.KVUsage), max(s.Queued, m.Queued), max(s.Running, m.Running)
	}
	for _, s := range slots {
		e, i := byURL[s.Endpoint], a.Index(s.Time)
		maxOf(&e.InFlight[i], float64(s.InFlight))
		if s.Limit > 0 {
			maxOf(&e.Limit[i], float64(s.Limit))
		}
		maxOf(&e.KVUsage[i], s.KVUsage)
		maxOf(&e.Queued[i], s.Queued)
		maxOf(&e.Running[i], s.Running)
	}
	for _, e := range byURL {
		h.Endpoints = append(h.Endpoints, *e)
	}
	sort.Slice(h.Endpoints, func(i, j int) bool { return h.Endpoints[i].URL < h.Endpoints[j].URL })
	return h
}

// maxOf keeps the largest known reading; negative readings are unknown.
func maxOf(p **float64, v float64) {
	if v < 0 {
		return
	}
	if *p == nil || v > **p {
		*p = &v
	}
}

// NowRate is the one "now" rate (Report.Rate1m): the rows of span's
// runs over stats.NowAxis ending at now, folded exactly as a chart's bucket
// is, so the tile, the last bucket of a one-minute chart and /metrics show
// the same number. An earlier run's rows never count: a run 3 s old is
// rated over its 3 s alone (Window says so), not credited with the minute
// before it.
func NowRate(rows []store.Minute, now time.Time, span RunSpan) Rate {
	started := span.Started
	a := stats.NowAxis(now, started, stats.SlotWidth(now, started))
	var samples int
	var tokens int64
	for _, m := range rows {
		if m.Endpoint == "" && a.Index(m.Time) == 0 && (len(span.Owners) == 0 || span.owns(m.Worker)) {
			samples += m.Samples
			tokens += m.Tokens
		}
	}
	from := a.Start
	if started.After(from) {
		from = started
	}
	r := Rate{Window: max(now.Sub(from), time.Second), Samples: samples, Tokens: tokens}
	r.SamplesPerSec = a.PerSecond(float64(samples), 0, now)
	r.TokensPerSec = a.PerSecond(float64(tokens), 0, now)
	return r
}

// readNowRate reads the rows NowRate needs.
func readNowRate(ctx context.Context, st store.JournalReader, now time.Time, span RunSpan) (Rate, error) {
	rows, err := st.Minutes(ctx, stats.NowAxis(now, span.Started, stats.SlotWidth(now, span.Started)).Start)
	if err != nil {
		return Rate{}, fmt.Errorf("read the last minute: %w", err)
	}
	return NowRate(rows, now, span), nil
}
