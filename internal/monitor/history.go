package monitor

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// History is the job's per-minute series over a window, summed over
// workers: what the views chart. Rates are per second over the minute
// (the current minute over its elapsed part); a gauge is null (nil) for a
// minute nobody scraped it.
type History struct {
	Times          []int64           `json:"times"` // unix seconds of each minute's start
	TokensPerSec   []float64         `json:"tokens_per_sec"`
	RequestsPerSec []float64         `json:"requests_per_sec"`
	SamplesPerSec  []float64         `json:"samples_per_sec"`
	ErrorsPerMin   []float64         `json:"errors_per_min"`
	Endpoints      []EndpointHistory `json:"endpoints"`
}

// EndpointHistory is one endpoint's series, aligned with History.Times.
type EndpointHistory struct {
	URL          string     `json:"url"`
	TokensPerSec []float64  `json:"tokens_per_sec"`
	InFlight     []*float64 `json:"in_flight"`
	KVUsage      []*float64 `json:"kv_usage"`
	Queued       []*float64 `json:"queued"`
	Running      []*float64 `json:"running"`
	Limit        []*float64 `json:"limit"`
}

// ReadHistory reads the minutes in (now-window, now] from the store and
// folds them into series with one point per minute, gaps included.
func ReadHistory(ctx context.Context, st store.Store, now time.Time, window time.Duration) (History, error) {
	last := now.Truncate(time.Minute)
	first := last.Add(-window).Add(time.Minute)
	rows, err := st.Minutes(ctx, first)
	if err != nil {
		return History{}, fmt.Errorf("read history: %w", err)
	}
	return FoldHistory(rows, first, last, now), nil
}

// FoldHistory builds the series for the minutes first..last from rows.
func FoldHistory(rows []store.Minute, first, last, now time.Time) History {
	n := int(last.Sub(first)/time.Minute) + 1
	if n < 1 {
		n = 1
	}
	h := History{Times: make([]int64, n), TokensPerSec: make([]float64, n), RequestsPerSec: make([]float64, n),
		SamplesPerSec: make([]float64, n), ErrorsPerMin: make([]float64, n)}
	secs := make([]float64, n)
	for i := range n {
		t := first.Add(time.Duration(i) * time.Minute)
		h.Times[i] = t.Unix()
		secs[i] = 60
		if el := now.Sub(t).Seconds(); el < 60 {
			secs[i] = max(el, 1)
		}
	}
	byURL := map[string]*EndpointHistory{}
	for _, m := range rows {
		i := int(m.Time.Sub(first) / time.Minute)
		if m.Time.Before(first) || i >= n {
			continue
		}
		if m.Endpoint == "" {
			h.TokensPerSec[i] += float64(m.Tokens) / secs[i]
			h.RequestsPerSec[i] += float64(m.Requests) / secs[i]
			h.SamplesPerSec[i] += float64(m.Samples) / secs[i]
			h.ErrorsPerMin[i] += float64(m.Errors)
			continue
		}
		e := byURL[m.Endpoint]
		if e == nil {
			e = &EndpointHistory{URL: m.Endpoint, TokensPerSec: make([]float64, n), InFlight: make([]*float64, n),
				KVUsage: make([]*float64, n), Queued: make([]*float64, n), Running: make([]*float64, n), Limit: make([]*float64, n)}
			byURL[m.Endpoint] = e
		}
		e.TokensPerSec[i] += float64(m.Tokens) / secs[i]
		// Several workers: in-flight and limits add up; the server's own
		// gauges are the same server seen twice, so the largest reading wins.
		add(&e.InFlight[i], float64(m.InFlight))
		if m.Limit > 0 {
			add(&e.Limit[i], float64(m.Limit))
		}
		maxOf(&e.KVUsage[i], m.KVUsage)
		maxOf(&e.Queued[i], m.Queued)
		maxOf(&e.Running[i], m.Running)
	}
	for _, e := range byURL {
		h.Endpoints = append(h.Endpoints, *e)
	}
	sort.Slice(h.Endpoints, func(i, j int) bool { return h.Endpoints[i].URL < h.Endpoints[j].URL })
	return h
}

func add(p **float64, v float64) {
	if *p == nil {
		*p = new(float64)
	}
	**p += v
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
