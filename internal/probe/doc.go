// Package probe takes one snapshot of a server's health and load: the
// engine's health endpoint (status code, latency, error), its Prometheus
// /metrics mapped onto engine.Metrics, and the KV pool size in tokens when
// the metrics do not carry it as a gauge: SGLang's /get_server_info
// max_total_num_tokens, vLLM's cache_config_info labels (num_gpu_blocks x
// block_size), llama-server's /props default_generation_settings.n_ctx.
//
// Probe performs requests only; it keeps no state and starts no goroutine
// that outlives the call. A HealthChecker (ProbeWith) is the one piece of
// state: which health probe works for a server without a health route
// (GET /v1/models, then a one-token completion). Scheduling probes and judging their results is the
// supervisor's job.
package probe
