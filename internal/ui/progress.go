package ui

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// Frame is one moment of a running job.
type Frame struct {
	Time      time.Time
	Job       string
	State     monitor.State
	Evidence  []string
	Cells     []monitor.CellCounts // per partition and lane
	Tokens    int64                // streamed chunks so far (≈ tokens)
	InFlight  int
	Endpoints []monitor.EndpointStatus
}

// Progress turns successive frames into rates and renders them.
type Progress struct {
	out      io.Writer
	terminal bool
	lines    int // lines drawn last time, to redraw in place

	start     time.Time
	lastTime  time.Time
	lastTok   int64
	lastDone  map[string]int
	tokRate   float64
	doneRates map[string]float64
}

// NewProgress writes to out; terminal selects in-place redraw.
func NewProgress(out io.Writer, terminal bool) *Progress {
	return &Progress{out: out, terminal: terminal, lastDone: map[string]int{}, doneRates: map[string]float64{}}
}

type partRow struct {
	name                                   string
	total, done, pending, inFlight, failed int
}

func partitions(cells []monitor.CellCounts) []partRow {
	m := map[string]*partRow{}
	for _, c := range cells {
		r := m[c.Partition]
		if r == nil {
			r = &partRow{name: c.Partition}
			m[c.Partition] = r
		}
		r.total += c.Total
		r.done += c.Done + c.Rejected
		r.pending += c.Pending
		r.inFlight += c.InFlight
		r.failed += c.Dead
	}
	var rows []partRow
	for _, r := range m {
		rows = append(rows, *r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	return rows
}

// smooth is an exponentially weighted rate so the ETA does not jump per frame.
func smooth(old, now float64) float64 {
	if old == 0 {
		return now
	}
	return 0.7*old + 0.3*now
}

// Update folds f into the rates and draws it.
func (p *Progress) Update(f Frame) {
	rows := partitions(f.Cells)
	if p.start.IsZero() {
		p.start, p.lastTime, p.lastTok = f.Time, f.Time, f.Tokens
		for _, r := range rows {
			p.lastDone[r.name] = r.done
		}
	} else if dt := f.Time.Sub(p.lastTime).Seconds(); dt > 0 {
		p.tokRate = smooth(p.tokRate, float64(f.Tokens-p.lastTok)/dt)
		for _, r := range rows {
			p.doneRates[r.name] = smooth(p.doneRates[r.name], float64(r.done-p.lastDone[r.name])/dt)
			p.lastDone[r.name] = r.done
		}
		p.lastTime, p.lastTok = f.Time, f.Tokens
	}
	text := p.Render(f, rows)
	if p.terminal {
		if p.lines > 0 {
			fmt.Fprintf(p.out, "\x1b[%dA\x1b[J", p.lines)
		}
		p.lines = strings.Count(text, "\n")
	}
	io.WriteString(p.out, text)
}

// Note prints a line that stays (a summary, a state change) above the
// block the next Update draws.
func (p *Progress) Note(line string) {
	if p.terminal && p.lines > 0 {
		fmt.Fprintf(p.out, "\x1b[%dA\x1b[J", p.lines)
		p.lines = 0
	}
	io.WriteString(p.out, strings.TrimRight(line, "\n")+"\n")
}

// Render draws f: a terminal block, or one compact line per frame otherwise.
func (p *Progress) Render(f Frame, rows []partRow) string {
	var b strings.Builder
	elapsed := f.Time.Sub(p.start).Round(time.Second)
	if !p.terminal {
		fmt.Fprintf(&b, "%s %s %s elapsed=%s in_flight=%d tok/s=%.0f", f.Time.Format("15:04:05"), f.Job, f.State, elapsed, f.InFlight, p.tokRate)
		for _, r := range rows {
			fmt.Fprintf(&b, " | %s %d/%d", r.name, r.done, r.total)
			if r.failed > 0 {
				fmt.Fprintf(&b, " dead=%d", r.failed)
			}
			if eta := etaOf(r, p.doneRates[r.name]); eta != "" {
				fmt.Fprintf(&b, " eta=%s", eta)
			}
		}
		if len(f.Evidence) > 0 {
			fmt.Fprintf(&b, " | %s", strings.Join(f.Evidence, "; "))
		}
		b.WriteString("\n")
		return b.String()
	}
	fmt.Fprintf(&b, "regen %s  %s  elapsed %s  in flight %d  %.0f tok/s\n", f.Job, f.State, elapsed, f.InFlight, p.tokRate)
	for _, e := range f.Evidence {
		fmt.Fprintf(&b, "  ! %s\n", e)
	}
	fmt.Fprintf(&b, "  %-20s %16s %6s %8s %8s %6s %9s\n", "partition", "done/total", "%", "pending", "inflight", "dead", "eta")
	for _, r := range rows {
		pct := 0.0
		if r.total > 0 {
			pct = 100 * float64(r.done+r.failed) / float64(r.total)
		}
		eta := etaOf(r, p.doneRates[r.name])
		if eta == "" {
			eta = "-"
		}
		fmt.Fprintf(&b, "  %-20s %16s %5.1f%% %8d %8d %6d %9s\n", r.name, fmt.Sprintf("%d/%d", r.done, r.total), pct, r.pending, r.inFlight, r.failed, eta)
	}
	for _, e := range f.Endpoints {
		fmt.Fprintf(&b, "  endpoint %s %s in flight %d", e.URL, e.State, e.InFlight)
		if e.Cause != "" {
			fmt.Fprintf(&b, " (%s)", e.Cause)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func etaOf(r partRow, rate float64) string {
	left := r.pending + r.inFlight
	if left == 0 {
		return "done"
	}
	if rate <= 0 {
		return ""
	}
	eta := time.Duration(float64(left) / rate * float64(time.Second))
	if eta < time.Second {
		return "<1s" // a few long requests left: "0s" would read as finished
	}
	return eta.Round(time.Second).String()
}
