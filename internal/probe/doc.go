// Package probe takes one snapshot of a server's health and load: the
// engine's health endpoint (status code, latency, error), its Prometheus
// /metrics mapped onto engine.Metrics, and what the server says of its
// pools and limits outside the metrics (docs/engines.md §13): SGLang's
// per-DP-rank pools and load (/v1/loads, else /server_info or
// /get_server_info; a DP server is one pool, their sum, whose pressure is
// the fullest rank's), vLLM's cache_config_info labels (num_gpu_blocks x
// block_size), max_model_len and /load, llama-server's slots and per-slot
// context (/props: pool = total_slots x n_ctx). Detect names a server's
// engine from what it says of itself.
//
// Probe performs requests only; it keeps no state and starts no goroutine
// that outlives the call. A HealthChecker (ProbeWith) is the one piece of
// state: which health probe works for a server without a health route
// (GET /v1/models, then a one-token completion). Scheduling probes and
// judging their results is the job of supervise (a launched server) and
// fleet (plain URLs and the in-process simulator).
package probe
