// Package web serves the job dashboard: read-only pages over the job's
// store (overview with throughput and KV-usage history, events timeline,
// dead letters and rejects, a sample browser), live updates by
// server-sent events, and regen's own Prometheus metrics at /metrics, all
// on one listener. Assets (uPlot for the charts, the page's own script and
// style) are embedded with go:embed; nothing is fetched from elsewhere and
// nothing needs building to run.
//
// It never changes the job: only GET and HEAD are served. It binds
// loopback unless a token is given; with a token every request must carry
// it (Authorization: Bearer, or the cookie set by visiting ?token= once),
// compared in constant time and never logged. Request lines are not
// logged at all, so no prompt text or token can reach a log.
//
// Neither the dispatcher nor the store may import this package; the
// runner's command wiring starts it.
package web
