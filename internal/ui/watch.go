package ui

import (
	"context"
	"fmt"
	"io"
	"math"
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
	// Events are the newest events, newest first, more than the report's
	// five: a tall terminal shows as many as fit (nil: the report's).
	Events []monitor.Event
	// Err is the last failed read; the view keeps the last good data and
	// says why it is stale.
	Err error
	// Dashboard is the web dashboard's address when watch serves one.
	Dashboard string
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
