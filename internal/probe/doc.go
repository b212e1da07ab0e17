// Package probe takes one snapshot of a server's health and load: the
// engine's health endpoint (status code, latency, error), its Prometheus
// /metrics mapped onto engine.Metrics, and for SGLang the KV pool size from
// /get_server_info when the metrics do not carry it.
//
// Probe performs requests only; it keeps no state and starts no goroutine
// that outlives the call. Scheduling probes and judging their results is the
// supervisor's job.
package probe
