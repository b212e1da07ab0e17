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
	model := cfg.modelName()
	if cfg.Engine == "vllm" {
		labels := prometheus.Labels{"model_name": model, "engine": "0"}
		g := func(name, help string) prometheus.Gauge {
			x := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:" + name, Help: help, ConstLabels: labels})
			m.reg.MustRegister(x)
			return x
		}
		c := func(name, help string) prometheus.Counter {
			x := prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:" + name, Help: help, ConstLabels: labels})
			m.reg.MustRegister(x)
			return x
		}
		h := func(name, help string, b []float64) prometheus.Observer {
			x := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:" + name, Help: help, ConstLabels: labels, Buckets: b})
			m.reg.MustRegister(x)
			return x
		}
		m.running = g("num_requests_running", "Number of requests in model execution batches.")
		m.queued = g("num_requests_waiting", "Number of requests waiting to be processed.")
		if cfg.APIShape == ShapePrevious {
			m.usageOld = g("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
		} else {
			m.tokenUsage = g("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
			m.queuedBy = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting_by_reason",
				Help: "Number of requests waiting, by reason.", ConstLabels: labels}, []string{"reason"})
			m.reg.MustRegister(m.queuedBy)
		}
		m.retracted = c("num_preemptions_total", "Cumulative number of preemption from the engine.")
		m.promptTokens = c("prompt_tokens_total", "Number of prefill tokens processed.")
		m.genTokens = c("generation_tokens_total", "Number of generation tokens processed.")
		m.prefixQueries = c("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
		m.prefixHits = c("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
		m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"})
		m.reg.MustRegister(m.success)
		m.ttft = h("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
		m.e2e = h("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets)
		m.queueTime = h("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", e2eBuckets)
		info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
			ConstLabels: prometheus.Labels{"model_name": model, "engine": "0", "block_size": "16", "num_gpu_blocks": itoa(cfg.kvTokens() / 16)}})
		info.Set(1)
		m.reg.MustRegister(info)
		return m
	}
	sched := prometheus.Labels{"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
	tok := prometheus.Labels{"model_name": model, "engine_type": "unified"}
	g := func(name, help string) prometheus.Gauge {
		x := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sglang:" + name, Help: help, ConstLabels: sched})
		m.reg.MustRegister(x)
		return x
	}
	c := func(name, help string, l prometheus.Labels) prometheus.Counter {
		x := prometheus.NewCounter(prometheus.CounterOpts{Name: "sglang:" + name, Help: help, ConstLabels: l})
		m.reg.MustRegister(x)
		return x
	}
	h := func(name, help string, b []float64) prometheus.Observer {
		x := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sglang:" + name, Help: help, ConstLabels: tok, Buckets: b})
		m.reg.MustRegister(x)
		return x
	}
	m.running = g("num_running_reqs", "The number of running requests.")
	m.queued = g("num_queue_reqs", "The number of requests in the waiting queue.")
	m.usedTokens = g("num_used_tokens", "The number of used tokens.")
	m.tokenUsage = g("token_usage", "The token usage.")
	m.genThroughput = g("gen_throughput", "The generation throughput (token/s).")
	m.cacheHitRate = g("cache_hit_rate", "The prefix cache hit rate.")
	m.maxTotal = g("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.")
	m.newTokenRatio = g("new_token_ratio", "The new token ratio.")
	m.retractedNow = g("num_retracted_reqs", "The number of retracted requests.")
	m.retracted = c("num_retracted_requests_total", "Total number of retracted requests.", sched)
	m.retractedIn = c("num_retracted_input_tokens_total", "Total number of retracted input tokens.", sched)
	m.retractedOut = c("num_retracted_output_tokens_total", "Total number of retracted output tokens.", sched)
	m.promptTokens = c("prompt_tokens_total", "Number of prefill tokens processed.", tok)
	m.genTokens = c("generation_tokens_total", "Number of generation tokens processed.", tok)
	m.cachedTokens = c("cached_tokens_total", "Number of cached prompt tokens.", tok)
	m.requests = c("num_requests_total", "Number of requests processed.", tok)
	m.aborted = c("num_aborted_requests_total", "Number of requests aborted.", tok)
	m.ttft = h("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.e2e = h("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", e2eBuckets)
	m.queueTime = h("queue_time_seconds", "Histogram of queueing time in seconds.", e2eBuckets)
	m.maxTotal.Set(float64(cfg.kvTokens()))
	if cfg.Engine == EngineLlamaCpp {
		m.llamaMetrics()
	}
	return m
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
