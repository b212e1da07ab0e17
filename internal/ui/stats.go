package ui

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/stats"
)

// StatsText renders dataset statistics as text: a table per partition and
// lane, rejects per rule, duplicates and a tokens-per-second sparkline.
func StatsText(r stats.Report) string {
	var b strings.Builder
	t := r.Total
	fmt.Fprintf(&b, "job %s: %d samples (%d done, %d rejected, %d dead, %d pending, %d in flight), %d answers stored\n",
		r.Job, t.Samples.Total, t.Samples.Done, t.Samples.Rejected, t.Samples.Dead, t.Samples.Pending, t.Samples.InFlight, t.Answers)
	fmt.Fprintf(&b, "bad source rows: %d; duplicate ids at ingest: %d", r.BadRows, r.Duplicates.Total)
	if r.Duplicates.Total > 0 {
		fmt.Fprintf(&b, " (%d with the same content)", r.Duplicates.SameContent)
	}
	b.WriteString("\n")
	writeGenerations(&b, r.Generations)
	b.WriteString("\n")
	const head = "%-18s %-8s %8s %8s %-26s %-26s %7s %7s %6s %9s\n"
	fmt.Fprintf(&b, head, "partition", "lane", "samples", "answers", "prompt p50/p90/p99/max", "completion p50/p90/p99/max", "trunc", "reject", "ended", "reasoning")
	row := func(p, l string, c stats.Cell) {
		fmt.Fprintf(&b, head, p, l, fmt.Sprint(c.Samples.Total), fmt.Sprint(c.Answers),
			pct(c.PromptTokens), pct(c.CompletionTokens), rate(c.TruncationRate, c.Answers), rate(c.RejectRate, c.Answers),
			fmt.Sprint(c.EndedEarly), rate(c.ReasoningShare, c.Answers))
	}
	for _, c := range r.Cells {
		row(c.Partition, c.Lane, c)
	}
	row("total", "", t)
	b.WriteString("(trunc and reject: share of answers; reasoning: share of completion tokens; ended: conversations cut short where the dataset could not follow the answer)\n")
	if len(r.Rejects) > 0 {
		b.WriteString("\nrejected by rule:")
		for _, rc := range r.Rejects {
			fmt.Fprintf(&b, " %s %d", rc.Rule, rc.N)
		}
		b.WriteString("\n")
	}
	for _, d := range r.Duplicates.Examples {
		same := "different content"
		if d.SameContent {
			same = "same content"
		}
		fmt.Fprintf(&b, "  duplicate id %s at %s (first at %s, %s)\n", d.ID, d.Origin, d.FirstOrigin, same)
	}
	if len(r.Throughput) > 0 {
		var max float64
		for _, p := range r.Throughput {
			max = maxf(max, p.CompletionPerSec)
		}
		first, last := r.Throughput[0], r.Throughput[len(r.Throughput)-1]
		bucket := time.Duration(r.BucketSeconds) * time.Second
		layout := "01-02 15:04"
		if bucket < time.Minute {
			layout = "01-02 15:04:05"
		}
		fmt.Fprintf(&b, "\ncompletion tokens/s, %s buckets, %s to %s (peak %.0f):\n  %s\n",
			bucket, first.Start.Format(layout), last.Start.Add(bucket).Format(layout), max, sparkline(r.Throughput, max))
	}
	return b.String()
}

// WriteStats writes StatsText to w.
func WriteStats(w io.Writer, r stats.Report) error {
	_, err := io.WriteString(w, StatsText(r))
	return err
}

func pct(p stats.Percentiles) string {
	if p.Max == 0 && p.Sum == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d/%d/%d", p.P50, p.P90, p.P99, p.Max)
}

func rate(v float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func maxf(a, b float64) float64 {
	if b > a {
		return b
	}
	return a
}

var bars = []rune("▁▂▃▄▅▆▇█")

func sparkline(ps []stats.Point, max float64) string {
	var b strings.Builder
	for _, p := range ps {
		if max <= 0 || p.CompletionPerSec <= 0 {
			b.WriteRune(' ')
			continue
		}
		i := int(p.CompletionPerSec / max * float64(len(bars)-1))
		b.WriteRune(bars[i])
	}
	return b.String()
}
