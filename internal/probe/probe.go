package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/regen-dev/regen/internal/engine"
)

// Snapshot is one probe of one server.
type Snapshot struct {
	URL  string    `json:"url"`
	Time time.Time `json:"time"` // when the probe started

	HealthStatus  int           `json:"health_status"` // 0 when no response arrived
	HealthLatency time.Duration `json:"health_latency"`
	HealthErr     error         `json:"-"`
	// HealthProbe names the probe that gave HealthStatus ("GET /health",
	// or a fallback of HealthChecker); HealthFallback says why it is not
	// the dialect's ("" when it is).
	HealthProbe    string `json:"health_probe"`
	HealthFallback string `json:"health_fallback,omitempty"`

	Metrics    engine.Metrics `json:"metrics"`
	MetricsErr error          `json:"-"`
}

// Healthy reports whether the health endpoint answered 200.
func (s Snapshot) Healthy() bool { return s.HealthErr == nil && s.HealthStatus == http.StatusOK }

// Probe checks health and scrapes metrics of the server at baseURL
// concurrently, each bounded by the dialect's probe timeout and ctx.
// Failures are reported in the Snapshot, never returned.
func Probe(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect) Snapshot {
	return ProbeWith(ctx, client, baseURL, d, nil)
}

// ProbeWith is Probe with health checked by hc, which falls back to other
// probes for a server without the dialect's health path (nil: that path
// alone).
func ProbeWith(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect, hc *HealthChecker) Snapshot {
	if client == nil {
		client = http.DefaultClient
	}
	baseURL = strings.TrimRight(baseURL, "/")
	snap := Snapshot{URL: baseURL, Time: time.Now()}
	timeout := d.ProbeTimeout
	if timeout <= 0 {
		timeout = engine.DefaultProbeTimeout
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		hctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		start := time.Now()
		if hc == nil {
			snap.HealthProbe = "GET " + d.HealthPath
			snap.HealthStatus, snap.HealthErr = Health(hctx, client, baseURL+d.HealthPath)
		} else {
			snap.HealthStatus, snap.HealthErr = hc.Check(hctx)
			snap.HealthProbe, snap.HealthFallback = hc.InUse()
		}
		snap.HealthLatency = time.Since(start)
	})
	if d.MetricsPath != "" {
		wg.Go(func() {
			mctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			snap.Metrics, snap.MetricsErr = scrape(mctx, client, baseURL, d)
		})
	}
	wg.Wait()
	return snap
}

// Health performs one GET and returns the status code; the body is discarded.
func Health(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("health %s: %w", url, err)
	}
	return statusOf(client, req)
}

// statusOf sends a health request and returns its status code, the body
// read (bounded) and discarded so the connection is reused.
func statusOf(client *http.Client, req *http.Request) (int, error) {
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("health %s: %w", req.URL, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, nil
}

func scrape(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect) (engine.Metrics, error) {
	url := baseURL + d.MetricsPath
	body, err := get(ctx, client, url, 64<<20)
	if err != nil {
		return engine.Metrics{}, err
	}
	defer body.Close()
	m, err := ParseMetrics(body, d.Metrics)
	if err != nil {
		return m, fmt.Errorf("metrics %s: %w", url, err)
	}
	readCapacity(ctx, client, baseURL, d, &m)
	return m, nil
}

func get(ctx context.Context, client *http.Client, url string, limit int64) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("get %s: status %d", url, resp.StatusCode)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, limit), resp.Body}, nil
}

// ParseMetrics reads Prometheus text exposition and maps it onto
// engine.Metrics with the given names. Values of one metric over several
// label sets are summed, except TokenUsage and MaxTotalTokens, which take the
// maximum (ranks share one budget each, summing would overstate it). With no
// pool metric, an info gauge named by KVPoolInfo gives the pool from its
// num_gpu_blocks and block_size labels.
func ParseMetrics(r io.Reader, names engine.MetricNames) (engine.Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return engine.Metrics{}, fmt.Errorf("parse: %w", err)
	}
	var m engine.Metrics
	fields := []struct {
		names []string
		dst   *float64
		bit   engine.Field
		max   bool
	}{
		{names.Running, &m.Running, engine.FieldRunning, false},
		{names.Queued, &m.Queued, engine.FieldQueued, false},
		{names.TokenUsage, &m.TokenUsage, engine.FieldTokenUsage, true},
		{names.GenerationTokensTotal, &m.GenerationTokensTotal, engine.FieldGenerationTokensTotal, false},
		{names.PromptTokensTotal, &m.PromptTokensTotal, engine.FieldPromptTokensTotal, false},
		{names.RetractionsTotal, &m.RetractionsTotal, engine.FieldRetractionsTotal, false},
		{names.MaxTotalTokens, &m.MaxTotalTokens, engine.FieldMaxTotalTokens, true},
	}
	for _, f := range fields {
		for _, name := range f.names {
			fam, ok := fams[name]
			if !ok {
				// The text parser strips a counter's _total suffix only in
				// OpenMetrics; in plain text the family keeps it. Accept both.
				fam, ok = fams[strings.TrimSuffix(name, "_total")]
			}
			if !ok || len(fam.GetMetric()) == 0 {
				continue
			}
			*f.dst = combine(fam, f.max)
			if f.bit == engine.FieldMaxTotalTokens {
				*f.dst = poolOverRanks(fam)
			}
			m.Present |= f.bit
			break
		}
	}
	if !m.Present.Has(engine.FieldMaxTotalTokens) {
		for _, name := range names.KVPoolInfo {
			if n := poolFromInfo(fams[name]); n > 0 {
				m.MaxTotalTokens = n
				m.Present |= engine.FieldMaxTotalTokens
				break
			}
		}
	}
	return m, nil
}

// poolFromInfo reads num_gpu_blocks x block_size from an info gauge's
// labels: one pool per vLLM engine (label engine; several behind one API
// server with data parallelism), summed as poolOverRanks does.
func poolFromInfo(fam *dto.MetricFamily) float64 {
	return sumOverLabel(fam, "engine", func(mt *dto.Metric) float64 {
		var blocks, size float64
		for _, lp := range mt.GetLabel() {
			v, err := strconv.ParseFloat(lp.GetValue(), 64)
			if err != nil {
				continue
			}
			switch lp.GetName() {
			case "num_gpu_blocks":
				blocks = v
			case "block_size":
				size = v
			}
		}
		return blocks * size
	})
}

// poolOverRanks is a pool gauge over its label sets: each data-parallel
// rank (label dp_rank) has its own pool, which its TP ranks all report,
// so the endpoint's pool is the sum over DP ranks of the largest value
// within each (docs/engines.md §13.1).
func poolOverRanks(fam *dto.MetricFamily) float64 { return sumOverLabel(fam, "dp_rank", value) }

// sumOverLabel groups the family's series by one label's value, takes the
// largest value of each group and sums the groups.
func sumOverLabel(fam *dto.MetricFamily, label string, val func(*dto.Metric) float64) float64 {
	byGroup := map[string]float64{}
	for _, mt := range fam.GetMetric() {
		group := ""
		for _, lp := range mt.GetLabel() {
			if lp.GetName() == label {
				group = lp.GetValue()
			}
		}
		byGroup[group] = max(byGroup[group], val(mt))
	}
	total := 0.0
	for _, v := range byGroup {
		total += v
	}
	return total
}

func combine(fam *dto.MetricFamily, useMax bool) float64 {
	var out float64
	for i, mt := range fam.GetMetric() {
		v := value(mt)
		switch {
		case useMax && (i == 0 || v > out):
			out = v
		case !useMax:
			out += v
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// Version reads the server's version from the first of the dialect's
// VersionPaths that answers (docs/engines.md §12); "" with no error when
// the dialect names none.
func Version(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect) (string, error) {
	id, err := Identify(ctx, client, baseURL, d)
	return id.Version, err
}

// Identity is what a server says of itself at its version route.
type Identity struct {
	Version string
	// Priority is how the server orders its queue by a request's
	// "priority" field: 0 when it does not (or did not say), +1 when
	// higher values go first, -1 when lower values do. SGLang's server
	// info carries its arguments: enable_priority_scheduling, and
	// schedule_low_priority_values_first for the direction (higher first
	// by default; docs/engines.md §16).
	Priority int
}

// Identify reads the server's version and, where its version route
// carries the server's arguments (SGLang), its priority scheduling.
func Identify(ctx context.Context, client *http.Client, baseURL string, d engine.Dialect) (Identity, error) {
	if client == nil {
		client = http.DefaultClient
	}
	var err error
	for _, path := range d.VersionPaths {
		var id Identity
		if id, err = identityAt(ctx, client, strings.TrimRight(baseURL, "/")+path, d.VersionField); err == nil {
			return id, nil
		}
	}
	return Identity{}, err
}

func identityAt(ctx context.Context, client *http.Client, url, field string) (Identity, error) {
	body, err := get(ctx, client, url, 16<<20)
	if err != nil {
		return Identity{}, err
	}
	defer body.Close()
	var fields map[string]json.RawMessage
	if err := json.NewDecoder(body).Decode(&fields); err != nil {
		return Identity{}, fmt.Errorf("version %s: %w", url, err)
	}
	raw, ok := fields[field]
	if !ok {
		return Identity{}, fmt.Errorf("version %s: no %q field", url, field)
	}
	var id Identity
	if err := json.Unmarshal(raw, &id.Version); err != nil {
		return Identity{}, fmt.Errorf("version %s: %s is not a string: %w", url, field, err)
	}
	var on, lowFirst bool
	if json.Unmarshal(fields["enable_priority_scheduling"], &on) == nil && on {
		id.Priority = 1
		if json.Unmarshal(fields["schedule_low_priority_values_first"], &lowFirst) == nil && lowFirst {
			id.Priority = -1
		}
	}
	return id, nil
}
