package ui

import (
	"fmt"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// StatusText renders a status report as one screen of text.
func StatusText(job string, r monitor.Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %s\n", job, r.State)
	for _, e := range r.Evidence {
		fmt.Fprintf(&b, "  evidence: %s\n", e)
	}
	if hb := r.Heartbeat; hb != nil {
		fmt.Fprintf(&b, "runner: pid %d on %s, last heartbeat %s ago, started %s\n",
			hb.PID, hb.Host, hb.Age.Round(time.Second), hb.Started.Format(time.RFC3339))
	} else if r.Store == nil {
		b.WriteString("runner: never started\n")
	}
	if r.Store != nil {
		fmt.Fprintf(&b, "store: %s: %s\n", r.Store.State, r.Store.Cause)
	}
	if len(r.Workers) > 1 {
		writeWorkers(&b, r.Workers)
	}
	fmt.Fprintf(&b, "\n%-20s %-10s %8s %8s %8s %9s %8s %6s\n", "partition", "lane", "total", "done", "pending", "in flight", "rejected", "dead")
	for _, c := range r.Cells {
		fmt.Fprintf(&b, "%-20s %-10s %8d %8d %8d %9d %8d %6d\n", c.Partition, c.Lane, c.Total, c.Done, c.Pending, c.InFlight, c.Rejected, c.Dead)
	}
	t := r.Total
	fmt.Fprintf(&b, "%-20s %-10s %8d %8d %8d %9d %8d %6d\n", "total", "", t.Total, t.Done, t.Pending, t.InFlight, t.Rejected, t.Dead)
	if r.IngestErrors > 0 {
		fmt.Fprintf(&b, "bad source rows (dead letters at ingest): %d\n", r.IngestErrors)
	}
	if len(r.Rejects) > 0 {
		b.WriteString("rejected by rule:")
		for i, rc := range r.Rejects {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s %d", rc.Rule, rc.N)
		}
		b.WriteString(" (exported to <name>.rejected.jsonl with the evidence; `regen requeue --rejected --rule R` sends them back)\n")
	}
	if r.Average != nil {
		a := r.Average
		fmt.Fprintf(&b, "\nthroughput: %.1f tok/s, %.2f samples/s on average (%d samples, %d tokens from the first result to the last, %s)\n",
			a.TokensPerSec, a.SamplesPerSec, a.Samples, a.Tokens, a.Window.Round(time.Second))
	} else {
		fmt.Fprintf(&b, "\nthroughput: %.1f tok/s, %.2f samples/s over %s; %.1f tok/s, %.2f samples/s over %s\n",
			r.Rate1m.TokensPerSec, r.Rate1m.SamplesPerSec, r.Rate1m.Window.Round(time.Second),
			r.Rate10m.TokensPerSec, r.Rate10m.SamplesPerSec, r.Rate10m.Window.Round(time.Second))
	}
	switch {
	case r.ETA > 0:
		fmt.Fprintf(&b, "eta: %s\n", r.ETA.Round(time.Second))
	case r.ETANote != "":
		fmt.Fprintf(&b, "eta: %s\n", r.ETANote)
	}
	if len(r.Endpoints) > 0 && len(r.Workers) <= 1 { // several workers list theirs above
		if r.RunnerExited {
			b.WriteString("\nendpoints when the runner exited:\n")
		} else {
			b.WriteString("\nendpoints:\n")
		}
		for _, e := range r.Endpoints {
			fmt.Fprintf(&b, "  %s %s", e.URL, e.State)
			if !e.Since.IsZero() {
				fmt.Fprintf(&b, " since %s", e.Since.Format("15:04:05"))
			}
			fmt.Fprintf(&b, ", in flight %d", e.InFlight)
			if !e.LastTokenAt.IsZero() && r.Heartbeat != nil {
				fmt.Fprintf(&b, ", last token %s before the heartbeat", r.Heartbeat.Time.Sub(e.LastTokenAt).Round(time.Second))
			}
			if e.Restarts > 0 {
				fmt.Fprintf(&b, ", %d restarts", e.Restarts)
			}
			if e.Cause != "" {
				fmt.Fprintf(&b, ", cause: %s", e.Cause)
			}
			b.WriteString("\n")
			for _, ev := range e.Evidence {
				fmt.Fprintf(&b, "    %s\n", ev)
			}
		}
	}
	if len(r.Events) > 0 {
		b.WriteString("\nlast events:\n")
		for _, e := range r.Events {
			fmt.Fprintf(&b, "  %s %s %s", e.Time.Format("15:04:05"), e.Kind, e.Subject)
			if e.State != "" {
				fmt.Fprintf(&b, " %s", e.State)
			}
			if e.Evidence != "" {
				fmt.Fprintf(&b, ": %s", e.Evidence)
			}
			b.WriteString("\n")
		}
	}
	if len(r.LastErrors) > 0 {
		b.WriteString("\nlast errors:\n")
		for _, e := range r.LastErrors {
			fmt.Fprintf(&b, "  %s [%s] %s\n", e.ID, e.State, e.Reason)
		}
	}
	return b.String()
}

// olderWorkersShown bounds the finished or dead workers listed after the
// live ones; a long job restarted many times has many.
const olderWorkersShown = 5

// writeWorkers lists every live worker and the most recent others.
func writeWorkers(b *strings.Builder, ws []monitor.WorkerStatus) {
	live := 0
	for _, w := range ws {
		if w.Live {
			live++
		}
	}
	fmt.Fprintf(b, "workers: %d live of %d\n", live, len(ws))
	older := 0
	for _, w := range ws {
		if !w.Live {
			older++
			if older > olderWorkersShown {
				continue
			}
		}
		fmt.Fprintf(b, "  %-16s pid %-7d %-10s heartbeat %5s ago, done %d, %.1f samples/s, in flight %d",
			w.Host, w.PID, w.State, w.HeartbeatAge.Round(time.Second), w.Done, w.Rate, w.InFlight)
		if len(w.Lanes) > 0 {
			fmt.Fprintf(b, ", lanes %s", strings.Join(w.Lanes, ","))
		}
		b.WriteString("\n")
		for _, e := range w.Endpoints {
			fmt.Fprintf(b, "      %s %s", e.URL, e.State)
			if e.Cause != "" {
				fmt.Fprintf(b, " (%s)", e.Cause)
			}
			b.WriteString("\n")
		}
		for _, ev := range w.Evidence {
			fmt.Fprintf(b, "      %s\n", ev)
		}
	}
	if older > olderWorkersShown {
		fmt.Fprintf(b, "  ... and %d older workers (finished, stopped or dead)\n", older-olderWorkersShown)
	}
}
