package ui

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
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
	writeWorkers(&b, r.Workers)
	fmt.Fprintf(&b, "\n%-20s %-10s %8s %8s %8s %9s %8s %6s\n", "partition", "lane", "total", "done", "pending", "in flight", "rejected", "dead")
	for _, c := range r.Cells {
		fmt.Fprintf(&b, "%-20s %-10s %8d %8d %8d %9s %8d %6d\n", c.Partition, c.Lane, c.Total, c.Done, c.Pending, inFlightCell(r, c.InFlight), c.Rejected, c.Dead)
	}
	t := r.Total
	fmt.Fprintf(&b, "%-20s %-10s %8d %8d %8d %9s %8d %6d\n", "total", "", t.Total, t.Done, t.Pending, inFlightCell(r, t.InFlight), t.Rejected, t.Dead)
	if note := strandedNote(r); note != "" {
		b.WriteString(note + "\n")
	}
	if r.IngestErrors > 0 {
		fmt.Fprintf(&b, "bad source rows (dead letters at ingest): %d\n", r.IngestErrors)
	}
	writeGenerations(&b, r.Generations)
	if r.Capture != nil {
		fmt.Fprintf(&b, "hidden states: %s\n", r.Capture.Text())
	}
	if len(r.Rejects) > 0 {
		b.WriteString("rejected by rule:")
		for i, rc := range r.Rejects {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s %d", rc.Rule, rc.N)
		}
		fmt.Fprintf(&b, " (%s; `regen requeue --rejected --rule R` sends them back)\n", rejectedWhere(r))
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
	if n := spanNote(r); n != "" {
		fmt.Fprintf(&b, "%s\n", n)
	}
	switch {
	case r.ETA > 0:
		fmt.Fprintf(&b, "eta: %s\n", r.ETA.Round(time.Second))
	case r.ETANote != "":
		fmt.Fprintf(&b, "eta: %s\n", r.ETANote)
	}
	if len(r.Endpoints) > 0 && liveCount(r.Workers) <= 1 { // several live workers list theirs above
		writeEndpoints(&b, r)
	}
	if len(r.Events) > 0 {
		b.WriteString("\nlast events:\n")
		for _, e := range r.Events {
			fmt.Fprintf(&b, "  %s %s\n", e.Time.Format("15:04:05"), e.Text())
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

// writeEndpoints lists the endpoints as the runner saw them (as of its
// death or exit when it is gone).
func writeEndpoints(b *strings.Builder, r monitor.Report) {
	switch {
	case r.RunnerDied && r.Heartbeat != nil:
		fmt.Fprintf(b, "\nendpoints when the runner died (its last heartbeat, %s; nothing is sent to them now):\n", r.Heartbeat.Time.Format("15:04:05"))
	case r.RunnerExited:
		b.WriteString("\nendpoints when the runner exited:\n")
	default:
		b.WriteString("\nendpoints:\n")
	}
	for _, e := range r.Endpoints {
		fmt.Fprintf(b, "  %s %s", e.URL, e.State)
		if !e.Since.IsZero() {
			fmt.Fprintf(b, " since %s", e.Since.Format("15:04:05"))
		}
		fmt.Fprintf(b, ", in flight %d", e.InFlight)
		if r.RunnerDied {
			b.WriteString(" when it died")
		}
		if !e.LastTokenAt.IsZero() && r.Heartbeat != nil {
			fmt.Fprintf(b, ", last token %s before the heartbeat", r.Heartbeat.Time.Sub(e.LastTokenAt).Round(time.Second))
		}
		if e.Restarts > 0 {
			fmt.Fprintf(b, ", %d restarts", e.Restarts)
		}
		if e.Replays > 0 {
			fmt.Fprintf(b, ", %d keep-alive replays", e.Replays)
		}
		if e.Cause != "" {
			fmt.Fprintf(b, ", cause: %s", e.Cause)
		}
		b.WriteString("\n")
		for _, ev := range e.Evidence {
			fmt.Fprintf(b, "    %s\n", ev)
		}
		if line := loadLine(e); line != "" {
			fmt.Fprintf(b, "    %s\n", line)
		}
		if e.LimitReason != "" {
			fmt.Fprintf(b, "    limit %d%s: %s\n", e.Limit, laneLimits(e), e.LimitReason)
		}
		if e.Hold != nil {
			fmt.Fprintf(b, "    %s\n", e.Hold.Text())
		}
	}
}

// inFlightCell is a count of leased samples for the table: as is while a
// runner is live, in parentheses when none is (nothing is in flight then;
// the samples wait for the next run), explained by strandedNote.
func inFlightCell(r monitor.Report, n int) string {
	if n > 0 && noLiveRunner(r) {
		return "(" + strconv.Itoa(n) + ")"
	}
	return strconv.Itoa(n)
}

// noLiveRunner reports whether the job's leases are held by a runner that
// is gone (it died, or exited without releasing them).
// spanNote says whose figures the rates and charts are when the newest
// run did no work; "" when they are its own.
func spanNote(r monitor.Report) string {
	sp := r.RatesRun
	if sp == nil || !sp.Earlier {
		return ""
	}
	return fmt.Sprintf("rates and charts: %s (%s)", runName(*sp), idleRun(r))
}

// runName names an earlier run the rates are over: "the last run that
// did work, pid 16204, 00:43:04 to 00:43:26 UTC".
func runName(sp monitor.RunSpan) string {
	pids := make([]string, len(sp.PIDs))
	for i, p := range sp.PIDs {
		pids[i] = strconv.Itoa(p)
	}
	return fmt.Sprintf("the last run that did work, pid %s, %s to %s UTC", strings.Join(pids, ", "),
		sp.Started.UTC().Format("15:04:05"), sp.Ended.UTC().Format("15:04:05"))
}

// idleRun says that the newest run did nothing, or has done nothing yet.
func idleRun(r monitor.Report) string {
	pid := 0
	if r.RatesRun != nil {
		pid = r.RatesRun.IdlePID
	}
	if noLiveRunner(r) {
		return fmt.Sprintf("the newest run, pid %d, sent nothing", pid)
	}
	return fmt.Sprintf("the newest run, pid %d, has sent nothing yet", pid)
}

func noLiveRunner(r monitor.Report) bool {
	return r.Heartbeat != nil && (r.RunnerDied || r.RunnerExited)
}

// strandedNote explains the parenthesised in-flight counts; "" when there
// are none.
func strandedNote(r monitor.Report) string {
	if r.Total.InFlight == 0 || !noLiveRunner(r) {
		return ""
	}
	how := "died"
	if r.RunnerExited {
		how = "exited"
	}
	return fmt.Sprintf("(%d): leased by the runner that %s at %s, not in flight; they go back to pending when the job runs again",
		r.Total.InFlight, how, r.Heartbeat.Time.Format("15:04:05"))
}

// loadLine is an endpoint's KV pool and its load at the last probe.
func loadLine(e monitor.EndpointStatus) string {
	var parts []string
	if e.KVTokens > 0 {
		parts = append(parts, fmt.Sprintf("KV pool %d tokens (%s)", e.KVTokens, e.KVTokensSource))
	}
	if l := e.Load; l != nil {
		if l.KVUsage != nil {
			parts = append(parts, fmt.Sprintf("%.0f%% used", 100**l.KVUsage))
		}
		if l.Running != nil {
			parts = append(parts, fmt.Sprintf("%.0f running", *l.Running))
		}
		if l.Queued != nil {
			parts = append(parts, fmt.Sprintf("%.0f queued", *l.Queued))
		}
		if l.RetractionsTotal != nil && *l.RetractionsTotal > 0 {
			parts = append(parts, fmt.Sprintf("%.0f retracted so far", *l.RetractionsTotal))
		}
		if note := l.StaleNote(); note != "" && len(parts) > 0 {
			parts[len(parts)-1] += " " + note
		}
	}
	return strings.Join(parts, ", ")
}

// laneLimits lists the per-lane limits when there are several lanes.
func laneLimits(e monitor.EndpointStatus) string {
	if len(e.Lanes) < 2 {
		return ""
	}
	var parts []string
	for _, l := range e.Lanes {
		kind := "fixed"
		if l.Auto {
			kind = "auto"
			if l.Ceiling > 0 {
				kind = fmt.Sprintf("auto, ceiling %d", l.Ceiling)
			}
		}
		parts = append(parts, fmt.Sprintf("%s %d %s", l.Lane, l.Limit, kind))
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// writeWorkers lists the live workers (and a dead host's last run) of a
// job that several workers share, and sums up the runs that ended.
func writeWorkers(b *strings.Builder, ws []monitor.WorkerStatus) {
	shown, history, section := workerGroups(ws)
	if section {
		fmt.Fprintf(b, "workers: %d live\n", liveCount(ws))
	}
	for _, w := range shown {
		if !section {
			break
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
	if history != "" {
		b.WriteString(history + "\n")
	}
}

// writeGenerations says which configuration the answers come from, and
// what earlier configurations left in the store's history.
func writeGenerations(b *strings.Builder, gens []store.Generation) {
	if len(gens) == 0 {
		return
	}
	cur := gens[len(gens)-1]
	fmt.Fprintf(b, "configuration: generation %d (fingerprint %.12s), %d answers", cur.N, cur.Fingerprint, cur.Answers)
	if cur.ServedModel != "" {
		fmt.Fprintf(b, " from %s", cur.ServedModel)
	}
	b.WriteString("\n")
	for _, g := range gens[:len(gens)-1] {
		fmt.Fprintf(b, "  generation %d (fingerprint %.12s): %d answers superseded, kept in the history, not exported\n",
			g.N, g.Fingerprint, g.Superseded)
	}
}

// rejectedWhere says where the rejected samples are with their evidence:
// in the file the last export wrote, as far as it counted them.
func rejectedWhere(r monitor.Report) string {
	file := r.RejectedFile
	if file == "" {
		file = "the output folder's <job name>.rejected.jsonl"
	}
	total := 0
	for _, rc := range r.Rejects {
		total += rc.N
	}
	switch {
	case r.RejectedExported == 0:
		return "not exported yet: `regen export` writes them to " + file + " with the evidence"
	case r.RejectedExported < total:
		return fmt.Sprintf("%d of them exported to %s with the evidence, the rest at the next export", r.RejectedExported, file)
	}
	return "exported to " + file + " with the evidence"
}
