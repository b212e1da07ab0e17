package monitor

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is regen's own Prometheus registry (never the global one). Two
// sources feed it: the runner reports every request (ObserveRequest), and
// every scrape reads the job's state from the store through the report
// function, so a process that only watches a job serves what the store
// knows. All names carry the regen_ prefix.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	tokens   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	ttft     *prometheus.HistogramVec
}

// NewMetrics builds the registry. report is called on every scrape with a
// bounded context; nil serves request metrics only.
func NewMetrics(report func(ctx context.Context) (Report, error)) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "regen_requests_total",
		Help: "Requests finished by this runner, by lane, endpoint and outcome (ok; cancelled, moved or shed, released without spending an attempt; unneeded, a backup the first answer made unnecessary; or the error class).",
	}, []string{"lane", "endpoint", "outcome"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "regen_errors_total",
		Help: "Failed requests by endpoint and error class (retryable, server-down, bad-request, malformed).",
	}, []string{"endpoint", "class"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "regen_tokens_generated_total",
		Help: "Completion tokens generated (as the server's usage reported them), by lane and endpoint.",
	}, []string{"lane", "endpoint"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "regen_request_duration_seconds",
		Help:    "Request duration from send to the last byte, by lane and endpoint.",
		Buckets: []float64{0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800},
	}, []string{"lane", "endpoint"})
	m.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "regen_ttft_seconds",
		Help:    "Time to the first streamed token, by lane and endpoint.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"lane", "endpoint"})
	m.reg.MustRegister(m.requests, m.errors, m.tokens, m.duration, m.ttft)
	if report != nil {
		m.reg.MustRegister(&storeCollector{report: report})
	}
	return m
}

// Registry is what /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Outcomes of a request that are not errors. They are the dispatcher's
// Attempt outcomes, spelled here so monitor does not import dispatch.
const (
	outcomeOK        = "ok"
	outcomeCancelled = "cancelled"
	outcomeMoved     = "moved"
	outcomeShed      = "shed"
	outcomeUnneeded  = "unneeded"
)

// ObserveRequest records one finished request. outcome is a dispatch
// Attempt's: ok, one of the cancellations that spend no attempt
// (cancelled, moved, shed, unneeded) or an error class name; ttft <= 0
// means no token came.
func (m *Metrics) ObserveRequest(lane, endpoint, outcome string, dur, ttft time.Duration, completionTokens int) {
	m.requests.WithLabelValues(lane, endpoint, outcome).Inc()
	switch outcome {
	case outcomeOK:
		m.duration.WithLabelValues(lane, endpoint).Observe(dur.Seconds())
		m.tokens.WithLabelValues(lane, endpoint).Add(float64(completionTokens))
	case outcomeCancelled, outcomeMoved, outcomeShed, outcomeUnneeded:
	default:
		m.errors.WithLabelValues(endpoint, outcome).Inc()
	}
	if ttft > 0 {
		m.ttft.WithLabelValues(lane, endpoint).Observe(ttft.Seconds())
	}
}

// scrapeTimeout bounds the store reads of one scrape.
const scrapeTimeout = 10 * time.Second

// States lists every job and endpoint state, so state gauges always carry
// the full set (0 or 1) and an alert can test for any of them.
var States = []State{Starting, Ready, Degraded, Running, Draining, Stalled, Down, Restarting, Failed, Done, Dead, Stopped}

var (
	descSamples = prometheus.NewDesc("regen_samples",
		"Samples by partition, lane and state (pending, in_flight, done, rejected, dead), from the store.",
		[]string{"partition", "lane", "state"}, nil)
	descJobState = prometheus.NewDesc("regen_job_state",
		"1 for the job's current state (as regen status judges it), 0 for the others.", []string{"state"}, nil)
	descHeartbeatAge = prometheus.NewDesc("regen_heartbeat_age_seconds",
		"Age of the runner's last heartbeat; absent when none was ever written.", nil, nil)
	descEndpointState = prometheus.NewDesc("regen_endpoint_state",
		"1 for each endpoint's current state, 0 for the others, from the runner's last heartbeat.", []string{"endpoint", "state"}, nil)
	descEndpointInFlight = prometheus.NewDesc("regen_endpoint_in_flight",
		"Requests regen has on the wire to each endpoint.", []string{"endpoint"}, nil)
	descKVUsage = prometheus.NewDesc("regen_endpoint_kv_usage_ratio",
		"KV cache usage of each endpoint (0..1), from its metrics.", []string{"endpoint"}, nil)
	descQueued = prometheus.NewDesc("regen_endpoint_queued_requests",
		"Requests waiting in each endpoint's queue, from its metrics.", []string{"endpoint"}, nil)
	descRunning = prometheus.NewDesc("regen_endpoint_running_requests",
		"Requests each endpoint is running, from its metrics.", []string{"endpoint"}, nil)
	descLimit = prometheus.NewDesc("regen_endpoint_concurrency_limit",
		"Requests regen lets each endpoint have at once now, all lanes (adaptive with concurrency: auto).", []string{"endpoint"}, nil)
	descTokensPerSec = prometheus.NewDesc("regen_tokens_per_second",
		"Tokens per second now, counted as they stream: the status report's rate_1m, the number the dashboard's tile and regen watch show.", nil, nil)
	descReplays = prometheus.NewDesc("regen_endpoint_keepalive_replays_total",
		"Requests the live runner sent again on a fresh connection because the endpoint closed the kept-alive one first (no attempt spent).", []string{"endpoint"}, nil)
	descSamplesPerSec = prometheus.NewDesc("regen_samples_per_second",
		"Samples finished per second now (rate_1m).", nil, nil)
	descIngestErrors = prometheus.NewDesc("regen_ingest_errors",
		"Source rows that could not become samples (dead letters at ingest).", nil, nil)
	descCaptureFiles = prometheus.NewDesc("regen_capture_files_total",
		"Hidden-state captures by state (captured, dead, in_flight, pending: waiting for another try), from the store; only for a job with a capture section.", []string{"state"}, nil)
	descCaptureRows = prometheus.NewDesc("regen_capture_rows",
		"Training rows the hidden-state capture found to capture (its last walk of the done samples); absent until it walked the job.", nil, nil)
	descCaptureBytes = prometheus.NewDesc("regen_capture_bytes_total",
		"Bytes of the captured hidden-state files, as recorded in the store.", nil, nil)
	descCaptureTokens = prometheus.NewDesc("regen_capture_tokens_total",
		"Tokens of the captured hidden-state files.", nil, nil)
	descScrapeError = prometheus.NewDesc("regen_store_read_error",
		"1 when this scrape could not read the job's store.", nil, nil)
)

// storeCollector reads the job's report on every scrape.
type storeCollector struct {
	report func(ctx context.Context) (Report, error)
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSamples, descJobState, descHeartbeatAge, descEndpointState,
		descEndpointInFlight, descLimit, descKVUsage, descQueued, descRunning, descTokensPerSec, descSamplesPerSec,
		descIngestErrors, descScrapeError, descReplays, descCaptureFiles, descCaptureRows, descCaptureBytes, descCaptureTokens} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	r, err := c.report(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descScrapeError, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(descScrapeError, prometheus.GaugeValue, 0)
	for _, cell := range r.Cells {
		for _, s := range []struct {
			name string
			n    int
		}{{"pending", cell.Pending}, {"in_flight", cell.InFlight}, {"done", cell.Done}, {"rejected", cell.Rejected}, {"dead", cell.Dead}} {
			ch <- prometheus.MustNewConstMetric(descSamples, prometheus.GaugeValue, float64(s.n), cell.Partition, cell.Lane, s.name)
		}
	}
	for _, s := range States {
		ch <- prometheus.MustNewConstMetric(descJobState, prometheus.GaugeValue, oneIf(r.State == s), string(s))
	}
	if r.Heartbeat != nil {
		ch <- prometheus.MustNewConstMetric(descHeartbeatAge, prometheus.GaugeValue, r.Heartbeat.Age.Seconds())
	}
	for _, e := range r.Endpoints {
		if r.RunnerDied || r.RunnerExited {
			// No runner is live: its last heartbeat's gauges are history, and
			// served as they are they would read as the present for ever (a
			// finished job's server "running 11 requests"). regen's own
			// in-flight is known to be 0 (nobody sends); the server's state,
			// load and our limit on it are unknown now, so they are dropped,
			// not zeroed: an absent series is "no data", a 0 would be a lie.
			ch <- prometheus.MustNewConstMetric(descEndpointInFlight, prometheus.GaugeValue, 0, e.URL)
			continue
		}
		for _, s := range States {
			ch <- prometheus.MustNewConstMetric(descEndpointState, prometheus.GaugeValue, oneIf(e.State == s), e.URL, string(s))
		}
		ch <- prometheus.MustNewConstMetric(descEndpointInFlight, prometheus.GaugeValue, float64(e.InFlight), e.URL)
		ch <- prometheus.MustNewConstMetric(descReplays, prometheus.CounterValue, float64(e.Replays), e.URL)
		if e.Limit > 0 {
			ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(e.Limit), e.URL)
		}
		if l := e.Load; l != nil {
			for _, g := range []struct {
				d *prometheus.Desc
				v *float64
			}{{descKVUsage, l.KVUsage}, {descQueued, l.Queued}, {descRunning, l.Running}} {
				if g.v != nil { // nil: the engine does not export it
					ch <- prometheus.MustNewConstMetric(g.d, prometheus.GaugeValue, *g.v, e.URL)
				}
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descTokensPerSec, prometheus.GaugeValue, r.Rate1m.TokensPerSec)
	ch <- prometheus.MustNewConstMetric(descSamplesPerSec, prometheus.GaugeValue, r.Rate1m.SamplesPerSec)
	ch <- prometheus.MustNewConstMetric(descIngestErrors, prometheus.GaugeValue, float64(r.IngestErrors))
	collectCapture(ch, r.Capture)
}

// collectCapture serves the capture's progress; nothing for a job
// without a capture section.
func collectCapture(ch chan<- prometheus.Metric, c *CaptureProgress) {
	if c == nil {
		return
	}
	for _, s := range []struct {
		name string
		n    int
	}{{"captured", c.Captured}, {"dead", c.Dead}, {"in_flight", c.InFlight}, {"pending", c.Pending}} {
		ch <- prometheus.MustNewConstMetric(descCaptureFiles, prometheus.GaugeValue, float64(s.n), s.name)
	}
	if c.Total != nil {
		ch <- prometheus.MustNewConstMetric(descCaptureRows, prometheus.GaugeValue, float64(*c.Total))
	}
	ch <- prometheus.MustNewConstMetric(descCaptureBytes, prometheus.CounterValue, float64(c.Bytes))
	ch <- prometheus.MustNewConstMetric(descCaptureTokens, prometheus.CounterValue, float64(c.Tokens))
}

func oneIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
