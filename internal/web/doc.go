// Package web serves the job dashboard: read-only pages over the job's
// store (overview with throughput and KV-usage history, events timeline,
// dead letters and rejects, a sample browser), live updates by
// server-sent events, and regen's own Prometheus metrics at /metrics, all
// on one listener. Assets (uPlot for the charts, the page's own script and
// style) are embedded with go:embed; nothing is fetched from elsewhere and
// nothing needs building to run.
//
// The sample page shows a sample turn by turn (package review, the same
// view `regen show` prints): each turn's input, the dataset's answer beside
// the regenerated one, how each answer was made, and why the conversation
// ended early, was rejected or died. The samples listing filters by state
// and partition in the store's query, and by rule, lane, ended early and
// generation over at most maxScan rows per request, with a cursor to go
// on. The page keeps its filters in its address (#samples?state=rejected&
// lane=long), so every filtered view is a link.
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
