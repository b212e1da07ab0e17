package sim

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics holds the exposed series, already bound to their labels so the
// scheduler's hot path is a few atomic adds. Names follow the engine.
type metrics struct {
	reg *prometheus.Registry

	// gauges (SGLang: set at prefill batches and every DecodeLogInterval decode steps)
	running, queued, usedTokens, tokenUsage, genThroughput, cacheHitRate,
	maxTotal, newTokenRatio, retractedNow, usageOld prometheus.Gauge
	// counters
	promptTokens, genTokens, cachedTokens, requests, aborted,
	retracted, retractedIn, retractedOut prometheus.Counter
	prefixQueries, prefixHits prometheus.Counter
	success                   *prometheus.CounterVec // vLLM, by finished_reason
	queuedBy                  *prometheus.GaugeVec   // vLLM, by reason (capacity, deferred)
	ttft, e2e, queueTime      prometheus.Observer
}

func newMetrics(cfg *Config) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	if cfg.Engine == "vllm" {
		m.vllmSeries(cfg)
		return m
	}
	m.sglangSeries(cfg)
	if cfg.Engine == EngineLlamaCpp {
		m.llamaMetrics()
	}
	return m
}

// family registers series whose names share the engine's prefix.
type family struct {
	reg    *prometheus.Registry
	prefix string
}

func (f family) gauge(name, help string, l prometheus.Labels) prometheus.Gauge {
	x := prometheus.NewGauge(prometheus.GaugeOpts{Name: f.prefix + name, Help: help, ConstLabels: l})
	f.reg.MustRegister(x)
	return x
}

func (f family) counter(name, help string, l prometheus.Labels) prometheus.Counter {
	x := prometheus.NewCounter(prometheus.CounterOpts{Name: f.prefix + name, Help: help, ConstLabels: l})
	f.reg.MustRegister(x)
	return x
}

func (f family) histogram(name, help string, l prometheus.Labels, b []float64) prometheus.Observer {
	x := prometheus.NewHistogram(prometheus.HistogramOpts{Name: f.prefix + name, Help: help, ConstLabels: l, Buckets: b})
	f.reg.MustRegister(x)
	return x
}

// vllmSeries registers vLLM's series, in the shape cfg.APIShape names.
func (m *metrics) vllmSeries(cfg *Config) {
	f := family{m.reg, "vllm:"}
	l := prometheus.Labels{"model_name": cfg.modelName(), "engine": "0"}
	m.running = f.gauge("num_requests_running", "Number of requests in model execution batches.", l)
	m.queued = f.gauge("num_requests_waiting", "Number of requests waiting to be processed.", l)
	if cfg.APIShape == ShapePrevious {
		m.usageOld = f.gauge("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", l)
	} else {
		m.tokenUsage = f.gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", l)
		m.queuedBy = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting_by_reason",
			Help: "Number of requests waiting, by reason.", ConstLabels: l}, []string{"reason"})
		m.reg.MustRegister(m.queuedBy)
	}
	m.retracted = f.counter("num_preemptions_total", "Cumulative number of preemption from the engine.", l)
	m.promptTokens = f.counter("prompt_tokens_total", "Number of prefill tokens processed.", l)
	m.genTokens = f.counter("generation_tokens_total", "Number of generation tokens processed.", l)
	m.prefixQueries = f.counter("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", l)
	m.prefixHits = f.counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", l)
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: l}, []string{"finished_reason"})
	m.reg.MustRegister(m.success)
	m.ttft = f.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", l, ttftBuckets)
	m.e2e = f.histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", l, e2eBuckets)
	m.queueTime = f.histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", l, e2eBuckets)
	info := f.gauge("cache_config_info", "Information of the LLMEngine CacheConfig",
		prometheus.Labels{"model_name": cfg.modelName(), "engine": "0", "block_size": "16", "num_gpu_blocks": itoa(cfg.kvTokens() / 16)})
	info.Set(1)
}

// sglangSeries registers SGLang's series: the scheduler's per rank, the
// tokenizer's per model.
func (m *metrics) sglangSeries(cfg *Config) {
	f := family{m.reg, "sglang:"}
	sched := prometheus.Labels{"model_name": cfg.modelName(), "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
	tok := prometheus.Labels{"model_name": cfg.modelName(), "engine_type": "unified"}
	m.running = f.gauge("num_running_reqs", "The number of running requests.", sched)
	m.queued = f.gauge("num_queue_reqs", "The number of requests in the waiting queue.", sched)
	m.usedTokens = f.gauge("num_used_tokens", "The number of used tokens.", sched)
	m.tokenUsage = f.gauge("token_usage", "The token usage.", sched)
	m.genThroughput = f.gauge("gen_throughput", "The generation throughput (token/s).", sched)
	m.cacheHitRate = f.gauge("cache_hit_rate", "The prefix cache hit rate.", sched)
	m.maxTotal = f.gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sched)
	m.newTokenRatio = f.gauge("new_token_ratio", "The new token ratio.", sched)
	m.retractedNow = f.gauge("num_retracted_reqs", "The number of retracted requests.", sched)
	m.retracted = f.counter("num_retracted_requests_total", "Total number of retracted requests.", sched)
	m.retractedIn = f.counter("num_retracted_input_tokens_total", "Total number of retracted input tokens.", sched)
	m.retractedOut = f.counter("num_retracted_output_tokens_total", "Total number of retracted output tokens.", sched)
	m.promptTokens = f.counter("prompt_tokens_total", "Number of prefill tokens processed.", tok)
	m.genTokens = f.counter("generation_tokens_total", "Number of generation tokens processed.", tok)
	m.cachedTokens = f.counter("cached_tokens_total", "Number of cached prompt tokens.", tok)
	m.requests = f.counter("num_requests_total", "Number of requests processed.", tok)
	m.aborted = f.counter("num_aborted_requests_total", "Number of requests aborted.", tok)
	m.ttft = f.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", tok, ttftBuckets)
	m.e2e = f.histogram("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", tok, e2eBuckets)
	m.queueTime = f.histogram("queue_time_seconds", "Histogram of queueing time in seconds.", tok, e2eBuckets)
	m.maxTotal.Set(float64(cfg.kvTokens()))
}

var (
	ttftBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	e2eBuckets  = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400}
)

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func set(g prometheus.Gauge, v float64) {
	if g != nil {
		g.Set(v)
	}
}

func add(c prometheus.Counter, v float64) {
	if c != nil && v > 0 {
		c.Add(v)
	}
}
