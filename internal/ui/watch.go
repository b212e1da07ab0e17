package ui

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/regen-dev/regen/internal/monitor"
)

// WatchSnapshot is everything `regen watch` shows at one moment, read from
// the store alone.
type WatchSnapshot struct {
	Job     string
	Now     time.Time
	Report  monitor.Report
	History monitor.History // the last hour, one point per minute
	// Err is the last failed read; the view keeps the last good data and
	// says why it is stale.
	Err error
}

// Pane is one of the watch view's panes; tab cycles them.
type Pane int

const (
	PaneProgress Pane = iota
	PaneEndpoints
	PaneEvents
	paneCount
)

var paneNames = [paneCount]string{"progress", "endpoints", "events"}

var (
	styleBold   = lipgloss.NewStyle().Bold(true)
	styleMuted  = lipgloss.NewStyle().Foreground(lipgloss.Color("245"))
	styleGood   = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("2"))
	styleWarn   = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("3"))
	styleBad    = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("1"))
	styleBar    = lipgloss.NewStyle().Foreground(lipgloss.Color("4"))
	styleActive = lipgloss.NewStyle().Bold(true).Reverse(true)
)

func stateStyle(s monitor.State) lipgloss.Style {
	switch monitor.ExitCode(s) {
	case 0:
		return styleGood
	case 1:
		return styleWarn
	}
	return styleBad
}

// RenderWatch draws s for a terminal of width x height: the state line and
// the pane tabs, then the chosen pane, cut to the height. It is a pure
// function of its arguments.
func RenderWatch(s WatchSnapshot, pane Pane, width, height int) string {
	if width <= 0 {
		width = 100
	}
	if height <= 0 {
		height = 40
	}
	r := s.Report
	var lines []string
	head := fmt.Sprintf("regen %s  %s  %s", s.Job, stateStyle(r.State).Render(string(r.State)), s.Now.Format("15:04:05"))
	if hb := r.Heartbeat; hb != nil {
		head += styleMuted.Render(fmt.Sprintf("  heartbeat %s ago, pid %d on %s", hb.Age.Round(time.Second), hb.PID, hb.Host))
	} else {
		head += styleMuted.Render("  no runner has written a heartbeat")
	}
	lines = append(lines, head)
	for _, e := range r.Evidence {
		lines = append(lines, "  ! "+e)
	}
	if s.Err != nil {
		lines = append(lines, styleBad.Render("  store read failed (showing the last good read): "+s.Err.Error()))
	}
	tabs := make([]string, 0, paneCount)
	for i, n := range paneNames {
		if Pane(i) == pane {
			tabs = append(tabs, styleActive.Render(" "+n+" "))
		} else {
			tabs = append(tabs, " "+n+" ")
		}
	}
	lines = append(lines, strings.Join(tabs, "")+styleMuted.Render("   tab: next pane  q: quit"), "")
	switch pane {
	case PaneEndpoints:
		lines = append(lines, workerLines(r, true)...)
		lines = append(lines, endpointLines(s, width, true)...)
	case PaneEvents:
		lines = append(lines, eventLines(r, width)...)
	default:
		lines = append(lines, progressLines(s, width)...)
		lines = append(lines, "")
		lines = append(lines, workerLines(r, false)...)
		lines = append(lines, endpointLines(s, width, false)...)
		if len(r.Events) > 0 {
			lines = append(lines, "", styleBold.Render("last events"))
			for _, e := range r.Events[:min(3, len(r.Events))] {
				lines = append(lines, "  "+eventText(e))
			}
		}
	}
	if len(lines) > height {
		lines = lines[:height]
	}
	for i, l := range lines {
		if lipgloss.Width(l) > width {
			lines[i] = cut(l, width)
		}
	}
	return strings.Join(lines, "\n")
}

// cut shortens a styled line to width cells.
func cut(s string, width int) string {
	return lipgloss.NewStyle().MaxWidth(width).Render(s)
}

func progressLines(s WatchSnapshot, width int) []string {
	r := s.Report
	nameW := len("total")
	for _, c := range r.Cells {
		nameW = max(nameW, len(c.Partition)+1+len(c.Lane))
	}
	barW := max(10, min(40, width-nameW-50))
	out := []string{styleBold.Render(fmt.Sprintf("%-*s  %-*s  %15s %6s %8s %9s %8s %6s", nameW, "partition/lane", barW+2, "progress", "done/total", "%", "pending", "in flight", "rejected", "dead"))}
	row := func(name string, c monitor.CellCounts) string {
		finished := c.Done + c.Rejected + c.Dead
		frac := 0.0
		if c.Total > 0 {
			frac = float64(finished) / float64(c.Total)
		}
		return fmt.Sprintf("%-*s  %s  %15s %5.1f%% %8d %9d %8d %6d", nameW, name, bar(frac, barW),
			fmt.Sprintf("%d/%d", c.Done, c.Total), 100*frac, c.Pending, c.InFlight, c.Rejected, c.Dead)
	}
	for _, c := range r.Cells {
		out = append(out, row(c.Partition+"/"+c.Lane, c))
	}
	out = append(out, row("total", r.Total))
	if r.IngestErrors > 0 {
		out = append(out, fmt.Sprintf("bad source rows (dead letters at ingest): %d", r.IngestErrors))
	}
	if len(r.Rejects) > 0 {
		rules := make([]string, 0, len(r.Rejects))
		for _, rc := range r.Rejects {
			rules = append(rules, fmt.Sprintf("%s %d", rc.Rule, rc.N))
		}
		out = append(out, "rejected by rule: "+strings.Join(rules, ", "))
	}
	out = append(out, "")
	sparkW := max(10, min(60, width-40))
	// Without an ETA the report says why (done, nothing progressing, no
	// recent throughput), as regen status does.
	eta := "unknown"
	switch {
	case r.ETA > 0:
		eta = fmtETA(r.ETA)
	case r.ETANote != "":
		eta = r.ETANote
	case r.State == monitor.Done:
		eta = "done"
	}
	out = append(out,
		fmt.Sprintf("tokens/s   %s %9.1f now (1m), %.1f over 10m", spark(s.History.TokensPerSec, sparkW), r.Rate1m.TokensPerSec, r.Rate10m.TokensPerSec),
		fmt.Sprintf("requests/s %s %9.2f now", spark(s.History.RequestsPerSec, sparkW), last(s.History.RequestsPerSec)),
		fmt.Sprintf("samples/s  %.2f (1m), %.2f (10m)   ETA %s", r.Rate1m.SamplesPerSec, r.Rate10m.SamplesPerSec, eta),
		styleMuted.Render(sparkNote(s.History, sparkW)))
	return out
}

func fmtETA(d time.Duration) string {
	if d < time.Second {
		return "<1s"
	}
	return d.Round(time.Second).String()
}

func last(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

func endpointLines(s WatchSnapshot, width int, detail bool) []string {
	r := s.Report
	if len(r.Endpoints) == 0 {
		return []string{styleMuted.Render("no endpoint reported yet")}
	}
	out := []string{styleBold.Render("endpoints")}
	hist := map[string]monitor.EndpointHistory{}
	for _, e := range s.History.Endpoints {
		hist[e.URL] = e
	}
	for _, e := range r.Endpoints {
		line := fmt.Sprintf("  %s %s  in flight %d", e.URL, stateStyle(e.State).Render(string(e.State)), e.InFlight)
		if e.Limit > 0 {
			line += fmt.Sprintf(" of limit %d", e.Limit)
		}
		if l := e.Load; l != nil {
			if l.KVUsage != nil {
				line += fmt.Sprintf("  KV %s %3.0f%%", bar(*l.KVUsage, 10), 100**l.KVUsage)
			}
			if l.Queued != nil {
				line += fmt.Sprintf("  queued %.0f", *l.Queued)
			}
			if l.Running != nil {
				line += fmt.Sprintf("  running %.0f", *l.Running)
			}
			if note := l.StaleNote(); note != "" {
				line += " " + styleMuted.Render(note)
			}
		}
		if e.Restarts > 0 {
			line += fmt.Sprintf("  restarts %d", e.Restarts)
		}
		if e.Cause != "" {
			line += "  (" + e.Cause + ")"
		}
		out = append(out, line)
		if !detail {
			continue
		}
		if !e.Since.IsZero() {
			out = append(out, styleMuted.Render("    since "+e.Since.Format("15:04:05")))
		}
		for _, ev := range e.Evidence {
			out = append(out, "    "+ev)
		}
		if e.LimitReason != "" {
			out = append(out, "    limit "+strconv.Itoa(e.Limit)+laneLimits(e)+": "+e.LimitReason)
		}
		if e.KVTokens > 0 {
			out = append(out, fmt.Sprintf("    KV pool %d tokens (%s)", e.KVTokens, e.KVTokensSource))
		}
		if h, ok := hist[e.URL]; ok {
			w := max(10, min(60, width-30))
			out = append(out, fmt.Sprintf("    KV usage   %s", sparkPtr(h.KVUsage, w, 1)),
				fmt.Sprintf("    queued     %s", sparkPtr(h.Queued, w, 0)),
				fmt.Sprintf("    tokens/s   %s", spark(h.TokensPerSec, w)))
		}
	}
	return out
}

// workerLines lists the workers sharing the job (a PostgreSQL store), live
// ones first, then the most recent others; nothing for a job of one runner.
// With detail each worker's endpoints follow it.
func workerLines(r monitor.Report, detail bool) []string {
	if len(r.Workers) < 2 {
		return nil
	}
	live := 0
	for _, w := range r.Workers {
		if w.Live {
			live++
		}
	}
	out := []string{styleBold.Render(fmt.Sprintf("workers: %d live of %d", live, len(r.Workers)))}
	older := 0
	add := func(w monitor.WorkerStatus) {
		line := fmt.Sprintf("  %s pid %d %s  heartbeat %s ago  done %d  %.2f samples/s  in flight %d",
			w.Host, w.PID, stateStyle(w.State).Render(string(w.State)), w.HeartbeatAge.Round(time.Second), w.Done, w.Rate, w.InFlight)
		if len(w.Lanes) > 0 {
			line += "  lanes " + strings.Join(w.Lanes, ",")
		}
		out = append(out, line)
		if !detail {
			return
		}
		for _, e := range w.Endpoints {
			l := "    " + e.URL + " " + stateStyle(e.State).Render(string(e.State))
			if e.Cause != "" {
				l += " (" + e.Cause + ")"
			}
			out = append(out, l)
		}
		for _, ev := range w.Evidence {
			out = append(out, "    "+ev)
		}
	}
	for _, w := range r.Workers {
		if w.Live {
			add(w)
		}
	}
	for _, w := range r.Workers {
		if !w.Live {
			if older++; older <= olderWorkersShown {
				add(w)
			}
		}
	}
	if older > olderWorkersShown {
		out = append(out, styleMuted.Render(fmt.Sprintf("  ... and %d older workers (finished, stopped or dead)", older-olderWorkersShown)))
	}
	return append(out, "")
}

func eventText(e monitor.Event) string {
	t := fmt.Sprintf("%s %s %s %s", e.Time.Format("15:04:05"), e.Kind, e.Subject, e.State)
	if e.Evidence != "" {
		t += ": " + e.Evidence
	}
	return t
}

func eventLines(r monitor.Report, width int) []string {
	out := []string{styleBold.Render("last events")}
	if len(r.Events) == 0 {
		out = append(out, styleMuted.Render("  none"))
	}
	for _, e := range r.Events {
		out = append(out, "  "+eventText(e))
	}
	out = append(out, "", styleBold.Render("last errors"))
	if len(r.LastErrors) == 0 {
		out = append(out, styleMuted.Render("  none"))
	}
	for _, e := range r.LastErrors {
		out = append(out, fmt.Sprintf("  %s [%s] %s", e.ID, e.State, e.Reason))
	}
	return out
}

// bar draws frac (0..1) as width cells.
func bar(frac float64, width int) string {
	frac = math.Max(0, math.Min(1, frac))
	full := int(math.Round(frac * float64(width)))
	return "[" + styleBar.Render(strings.Repeat("█", full)) + strings.Repeat("░", width-full) + "]"
}

var sparkRunes = []rune("▁▂▃▄▅▆▇█")

// sparkNote says what the sparklines span: the job's run cut by the one
// rule (stats.AxisFor), of which the last width bars are drawn.
func sparkNote(h monitor.History, width int) string {
	n := min(width, len(h.Times))
	if n == 0 {
		return "sparklines: no history yet"
	}
	bucket := time.Duration(h.BucketSeconds * float64(time.Second))
	return fmt.Sprintf("sparklines: one bar per %s since %s", bucket, time.Unix(h.Times[len(h.Times)-n], 0).Format("15:04:05"))
}

// spark draws the last width values scaled to their maximum.
func spark(xs []float64, width int) string {
	ps := make([]*float64, len(xs))
	for i := range xs {
		ps[i] = &xs[i]
	}
	return sparkPtr(ps, width, 0)
}

// sparkPtr draws the last width values (nil = unknown, a blank) scaled to
// top, or to their maximum when top is 0.
func sparkPtr(xs []*float64, width int, top float64) string {
	if len(xs) > width {
		xs = xs[len(xs)-width:]
	}
	// A young job has fewer buckets than cells: each gets several, so
	// the line spans the job instead of sitting at the right edge.
	if k := width / max(len(xs), 1); k > 1 {
		wide := make([]*float64, 0, k*len(xs))
		for _, x := range xs {
			for range k {
				wide = append(wide, x)
			}
		}
		xs = wide
	}
	hi := top
	if hi == 0 {
		for _, x := range xs {
			if x != nil {
				hi = math.Max(hi, *x)
			}
		}
	}
	var b strings.Builder
	for range width - len(xs) {
		b.WriteRune(' ')
	}
	for _, x := range xs {
		switch {
		case x == nil:
			b.WriteRune(' ')
		case hi <= 0:
			b.WriteRune(sparkRunes[0])
		default:
			i := int(math.Round(*x / hi * float64(len(sparkRunes)-1)))
			b.WriteRune(sparkRunes[max(0, min(len(sparkRunes)-1, i))])
		}
	}
	return styleBar.Render(b.String())
}

// watchModel is the bubbletea model behind RunWatch.
type watchModel struct {
	load  func(context.Context) (WatchSnapshot, error)
	ctx   context.Context
	every time.Duration
	snap  WatchSnapshot
	have  bool
	pane  Pane
	w, h  int
}

type snapMsg struct {
	s   WatchSnapshot
	err error
}

type tickMsg struct{}

func (m *watchModel) fetch() tea.Msg {
	s, err := m.load(m.ctx)
	return snapMsg{s, err}
}

func (m *watchModel) Init() tea.Cmd { return m.fetch }

func (m *watchModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyPressMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case "tab", "right":
			m.pane = (m.pane + 1) % paneCount
		case "shift+tab", "left":
			m.pane = (m.pane + paneCount - 1) % paneCount
		}
	case tea.WindowSizeMsg:
		m.w, m.h = msg.Width, msg.Height
	case snapMsg:
		if msg.err != nil {
			m.snap.Err = msg.err
		} else {
			m.snap, m.have = msg.s, true
		}
		return m, tea.Tick(m.every, func(time.Time) tea.Msg { return tickMsg{} })
	case tickMsg:
		return m, m.fetch
	}
	return m, nil
}

func (m *watchModel) View() tea.View {
	content := "regen watch: reading the store…"
	if m.have {
		content = RenderWatch(m.snap, m.pane, m.w, m.h)
	} else if m.snap.Err != nil {
		content = "regen watch: cannot read the store: " + m.snap.Err.Error()
	}
	v := tea.NewView(content)
	v.AltScreen = true
	v.WindowTitle = "regen watch " + m.snap.Job
	return v
}

// RunWatch runs the full-screen view on a terminal until q, Ctrl-C or ctx
// ends, reloading the snapshot every period.
func RunWatch(ctx context.Context, in io.Reader, out io.Writer, every time.Duration, load func(context.Context) (WatchSnapshot, error)) error {
	m := &watchModel{load: load, ctx: ctx, every: every}
	p := tea.NewProgram(m, tea.WithContext(ctx), tea.WithInput(in), tea.WithOutput(out))
	_, err := p.Run()
	if ctx.Err() != nil {
		return nil
	}
	return err
}
