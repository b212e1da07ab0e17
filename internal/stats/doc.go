// Package stats computes what `regen stats` shows about a job's dataset:
// per partition and lane, the samples in each state, the answers stored
// (one per regenerated turn), exact prompt and completion token
// percentiles (p50, p90, p99, max), truncation, reject and ended-early
// counts, the share of reasoning, rejects per rule, the history of
// tokens per second, duplicate ids found at ingest and bad source rows.
//
// Compute reads only aggregates the store keeps up to date with every
// stored answer (store.StatCells, EachTokenCount, ThroughputHistory,
// RejectCounts, Counts, IngestDuplicates), so it costs the same for 10^3
// samples as for 10^7 and holds, besides the per-cell rows, one count per
// distinct token value of the overall histograms; only a job of under an
// hour has its throughput read from its answers (ThroughputBuckets), in
// buckets down to a second. Report is versioned JSON (ReportVersion) for
// `regen stats --json` and the web dashboard. The package never writes to
// the store and never prints.
//
// It also owns the time axis of every series regen draws (axis.go): the
// one rule choosing window and bucket from a job's span (AxisFor), the
// one per-bucket rate (Axis.PerSecond), what "now" means (NowAxis), and
// the slots the runner's history rows use (SlotAt). The dashboard's
// charts, regen watch's sparklines, regen stats and the status report's
// rate_1m all go through them.
package stats
