package ui

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/regen-dev/regen/internal/monitor"
)

// escalationTail is what escalations still to come add to the wait for n
// requests of lane lt: the chance that at least one of them escalates
// (at the lane's observed rate) times the escalation lane's mean duration.
func escalationTail(lanes []monitor.LaneTiming, lt monitor.LaneTiming, n int) time.Duration {
	if lt.EscalateTo == "" || lt.Answered == 0 || lt.Escalated == 0 || n <= 0 {
		return 0
	}
	target, ok := laneTiming(lanes, lt.EscalateTo)
	if !ok {
		return 0
	}
	mean := target.MeanDuration
	if mean <= 0 {
		// Nothing answered there yet: at least as long as this lane's.
		mean = lt.MeanDuration
	}
	f := float64(lt.Escalated) / float64(lt.Answered)
	p := 1 - math.Pow(1-f, float64(n))
	return time.Duration(p * float64(mean))
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
	reasons   map[string]string // the limit reason last printed per endpoint (plain lines)
}

// NewProgress writes to out; terminal selects in-place redraw.
func NewProgress(out io.Writer, terminal bool) *Progress {
	return &Progress{out: out, terminal: terminal, lastDone: map[string]int{}, doneRates: map[string]float64{}}
}

type partRow struct {
	name                                   string
	total, done, pending, inFlight, failed int
	lanes                                  map[string][2]int // lane -> pending, in flight
}

func partitions(cells []monitor.CellCounts) []partRow {
	m := map[string]*partRow{}
	for _, c := range cells {
		r := m[c.Partition]
		if r == nil {
			r = &partRow{name: c.Partition, lanes: map[string][2]int{}}
			m[c.Partition] = r
		}
		if c.Pending+c.InFlight > 0 {
			l := r.lanes[c.Lane]
			r.lanes[c.Lane] = [2]int{l[0] + c.Pending, l[1] + c.InFlight}
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
func (p *Progress) Update(f monitor.Frame) {
	rows := partitions(f.Cells)
	if p.start.IsZero() {
		p.start, p.lastTime, p.lastTok = f.Time, f.Time, f.Tokens
		for _, r := range rows {
			p.lastDone[r.name] = r.done
		}
	} else if dt := f.Time.Sub(p.lastTime).Seconds(); dt > 0 {
		// While nothing can progress the rates are what they are (zero),
		// not a smoothed memory of better times.
		fold := smooth
		if f.State != monitor.Running {
			fold = func(_, now float64) float64 { return now }
		}
		p.tokRate = fold(p.tokRate, float64(f.Tokens-p.lastTok)/dt)
		for _, r := range rows {
			p.doneRates[r.name] = fold(p.doneRates[r.name], float64(r.done-p.lastDone[r.name])/dt)
			p.lastDone[r.name] = r.done
		}
		p.lastTime, p.lastTok = f.Time, f.Tokens
	}
	text := p.Render(f, rows)
	if p.terminal {
		// Lines wider than the terminal would wrap there and spoil the
		// count of lines to redraw: wrap them here, at word boundaries.
		if w := p.width(); w > 0 {
			text = strings.Join(wrapAll(strings.Split(strings.TrimSuffix(text, "\n"), "\n"), w, 4), "\n") + "\n"
		}
		p.erase()
		p.lines = strings.Count(text, "\n")
	}
	io.WriteString(p.out, text)
}

// width is the terminal's width, 0 when unknown.
func (p *Progress) width() int {
	f, ok := p.out.(*os.File)
	if !ok {
		return 0
	}
	w, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return w
}

// erase moves back over the last frame and clears it. It starts at the
// line's first column: the terminal may have echoed ^C after the frame.
func (p *Progress) erase() {
	if p.lines > 0 {
		fmt.Fprintf(p.out, "\r\x1b[%dA\x1b[J", p.lines)
	}
}

// Show is the view's subscription to the runner's frames: it prints the
// frame's notes, then draws the frame.
func (p *Progress) Show(f monitor.Frame) {
	for _, n := range f.Notes {
		p.Note(n)
	}
	p.Update(f)
}

// Note prints a line of its own above the progress (a warning the user
// must see, not only a state in the next frame); it stays in the
// terminal's scrollback.
func (p *Progress) Note(line string) {
	if p.terminal {
		p.erase()
		p.lines = 0 // the next frame draws below the note
	}
	fmt.Fprintln(p.out, line)
}

// Render draws f: a terminal block, or one compact line per frame otherwise.
func (p *Progress) Render(f monitor.Frame, rows []partRow) string {
	var b strings.Builder
	elapsed := f.Time.Sub(p.start).Round(time.Second)
	if !p.terminal {
		fmt.Fprintf(&b, "%s %s %s elapsed=%s in_flight=%d tok/s=%.0f", f.Time.Format("15:04:05"), f.Job, f.State, elapsed, f.InFlight, p.tokRate)
		for _, r := range rows {
			fmt.Fprintf(&b, " | %s %d/%d", r.name, r.done, r.total)
			if r.failed > 0 {
				fmt.Fprintf(&b, " dead=%d", r.failed)
			}
			if eta := p.etaOf(f, r); eta != "" {
				fmt.Fprintf(&b, " eta=%s", eta)
			}
		}
		for _, e := range f.Endpoints {
			if e.Limit > 0 {
				fmt.Fprintf(&b, " | %s limit=%d", e.URL, e.Limit)
			}
		}
		if len(f.Evidence) > 0 {
			fmt.Fprintf(&b, " | %s", strings.Join(f.Evidence, "; "))
		}
		b.WriteString("\n")
		if p.reasons == nil {
			p.reasons = map[string]string{}
		}
		for _, e := range f.Endpoints {
			// Each move once, not on every frame.
			if e.LimitReason != "" && p.reasons[e.URL] != e.LimitReason {
				p.reasons[e.URL] = e.LimitReason
				fmt.Fprintf(&b, "%s limit %s %d: %s\n", f.Time.Format("15:04:05"), e.URL, e.Limit, e.LimitReason)
			}
		}
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
		eta := p.etaOf(f, r)
		if eta == "" {
			eta = "-"
		}
		fmt.Fprintf(&b, "  %-20s %16s %5.1f%% %8d %8d %6d %9s\n", r.name, fmt.Sprintf("%d/%d", r.done, r.total), pct, r.pending, r.inFlight, r.failed, eta)
	}
	for _, e := range f.Endpoints {
		fmt.Fprintf(&b, "  endpoint %s %s", e.URL, e.State)
		if !e.Since.IsZero() {
			fmt.Fprintf(&b, " since %s", e.Since.Format("15:04:05"))
		}
		fmt.Fprintf(&b, ", in flight %d", e.InFlight)
		if e.Limit > 0 {
			fmt.Fprintf(&b, " of %d", e.Limit)
		}
		if e.Cause != "" {
			fmt.Fprintf(&b, " (%s)", e.Cause)
		}
		b.WriteString("\n")
		if e.LimitReason != "" {
			fmt.Fprintf(&b, "    limit: %s\n", e.LimitReason)
		}
	}
	return b.String()
}

// etaOf estimates when partition r finishes, "" when it cannot be known or
// nothing progresses. Queued work drains at the partition's finish rate and
// its last request then needs its lane's mean duration; once nothing is
// queued, what is left is the in-flight tail (dispatch estimates it from
// the lane's answered durations and the requests' ages). Either way the
// answers still to come may be truncated and escalate: at the lane's
// observed escalation rate, that adds a request in the bigger lane.
func (p *Progress) etaOf(f monitor.Frame, r partRow) string {
	left := r.pending + r.inFlight
	if left == 0 {
		return "done"
	}
	if f.State != monitor.Running {
		return ""
	}
	rate := p.doneRates[r.name]
	var queue, tail time.Duration
	if r.pending > 0 {
		if rate <= 0 {
			return ""
		}
		queue = time.Duration(float64(r.pending) / rate * float64(time.Second))
	}
	known := false
	leased := map[string]int{} // per lane, every partition
	for _, c := range f.Cells {
		leased[c.Lane] += c.InFlight
	}
	for lane, n := range r.lanes {
		lt, ok := laneTiming(f.Lanes, lane)
		if !ok || lt.MeanDuration <= 0 {
			continue
		}
		known = true
		t := lt.Tail
		if n[0] > 0 {
			t = lt.MeanDuration
		}
		if target, ok := laneTiming(f.Lanes, lt.EscalateTo); ok && lt.InFlight+lt.Kept < leased[lane] {
			t = max(t, target.Tail) // some of its samples are being answered there
		}
		// Then the escalations still to come among its last requests
		// (about as many as are in flight now).
		tail = max(tail, t+escalationTail(f.Lanes, lt, max(n[1], 1)))
	}
	if !known && r.pending == 0 {
		if rate <= 0 {
			return ""
		}
		tail = time.Duration(float64(r.inFlight) / rate * float64(time.Second))
	}
	eta := queue + tail
	if eta < time.Second {
		return "<1s" // "0s" would read as finished
	}
	return eta.Round(time.Second).String()
}

func laneTiming(lanes []monitor.LaneTiming, name string) (monitor.LaneTiming, bool) {
	for _, l := range lanes {
		if l.Name == name {
			return l, true
		}
	}
	return monitor.LaneTiming{}, false
}
