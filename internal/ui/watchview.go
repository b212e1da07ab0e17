package ui

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/regen-dev/regen/internal/monitor"
)

// RenderWatch draws s for a terminal of width x height: the state line and
// the pane tabs, then the chosen pane, laid out for that size. Nothing is
// cut silently: lines wrap, the table narrows by stated steps (see
// layout.go), and what does not fit the height is counted on the last
// line. Spare height on the progress pane goes to per-endpoint detail and
// then to as many events as fit. It is a pure function of its arguments.
func RenderWatch(s WatchSnapshot, pane Pane, width, height int) string {
	if width <= 0 {
		width = 100
	}
	if height <= 0 {
		height = 40
	}
	top := headLines(s, width)
	tabs := make([]string, 0, paneCount)
	for i, n := range paneNames {
		if Pane(i) == pane {
			tabs = append(tabs, styleActive.Render(" "+n+" "))
		} else {
			tabs = append(tabs, " "+n+" ")
		}
	}
	top = append(top, wrap(strings.Join(tabs, "")+styleMuted.Render("   tab: next pane  q: quit"), width, 1)...)
	top = append(top, "")
	var body []string
	switch pane {
	case PaneEndpoints:
		body = append(workerLines(s.Report, true, width), endpointLines(s, width, true)...)
	case PaneEvents:
		body = eventLines(s, width)
	default:
		body = progressPane(s, width, height-len(top))
	}
	return strings.Join(fitHeight(append(top, body...), width, height), "\n")
}

// headLines are the state line (with the heartbeat, wrapped when narrow),
// the evidence and a failed read, wrapped.
func headLines(s WatchSnapshot, width int) []string {
	r := s.Report
	head := fmt.Sprintf("regen %s  %s  %s", s.Job, stateStyle(r.State).Render(string(r.State)), s.Now.Format("15:04:05"))
	hb := "  no runner has written a heartbeat"
	if h := r.Heartbeat; h != nil {
		hb = fmt.Sprintf("  heartbeat %s ago, pid %d on %s", h.Age.Round(time.Second), h.PID, h.Host)
	}
	var out []string
	if ansi.StringWidth(head+hb) <= width {
		out = []string{head + styleMuted.Render(hb)}
	} else {
		out = append(wrap(head, width, 2), wrap(styleMuted.Render(" "+hb), width, 3)...)
	}
	if s.Dashboard != "" {
		out = append(out, wrap(styleMuted.Render("  dashboard at "+s.Dashboard), width, 4)...)
	}
	for _, e := range r.Evidence {
		out = append(out, wrap("  ! "+e, width, 4)...)
	}
	if s.Err != nil {
		out = append(out, wrap(styleBad.Render("  store read failed (showing the last good read): "+s.Err.Error()), width, 4)...)
	}
	return out
}

// fitHeight keeps lines within height; what does not fit is counted on
// the last line, never dropped silently. Lines wider than width (none
// should be) are cut as a last resort.
func fitHeight(lines []string, width, height int) []string {
	if len(lines) > height {
		hidden := len(lines) - height + 1
		lines = append(lines[:height-1], styleMuted.Render(fmt.Sprintf("… %d more lines below (a taller terminal shows them)", hidden)))
	}
	for i, l := range lines {
		if ansi.StringWidth(l) > width {
			lines[i] = ansi.Truncate(l, width, "…")
		}
	}
	return lines
}

// progressPane is the table, the rates and the endpoints, always; then,
// as the height (avail) allows, the table's notes, the workers, each
// endpoint's detail and the newest events, in that order of value.
func progressPane(s WatchSnapshot, width, avail int) []string {
	table, notes := progressLines(s, width)
	rates, caption := rateLines(s, width)
	workers := workerLines(s.Report, false, width)
	endpoints := endpointLines(s, width, false)
	spare := avail - len(table) - len(rates) - len(endpoints) - 1 // a blank line before the endpoints
	take := func(ls []string) []string {
		if len(ls) > spare {
			return nil
		}
		spare -= len(ls)
		return ls
	}
	notes = take(notes)
	if caption != "" && spare >= 2 {
		rates = append(rates, caption)
		spare--
	}
	sep := take([]string{""}) // between the table and the rates
	workers = take(workers)
	var detail []string
	for _, e := range s.Report.Endpoints {
		if d := endpointDetail(s, e, width); len(d) <= spare-3 { // room left for a few events
			detail = append(detail, d...)
			spare -= len(d)
		}
	}
	out := append(append(append(table, notes...), sep...), rates...)
	out = append(append(append(append(out, ""), workers...), endpoints...), detail...)
	events := s.Events
	if events == nil {
		events = s.Report.Events
	}
	if len(events) > 0 && spare >= 3 {
		out = append(out, "", styleBold.Render("last events"))
		spare -= 2
		for _, e := range events {
			l := wrap("  "+eventText(e), width, 4)
			if len(l) > spare {
				break
			}
			out = append(out, l...)
			spare -= len(l)
		}
	}
	return out
}

// progressLines are the table of partitions and lanes (its legend and
// the stranded-lease note included) and the notes under it.
func progressLines(s WatchSnapshot, width int) (tableLines, notes []string) {
	r := s.Report
	name := column{head: "partition/lane", left: true}
	cols := []column{
		{head: "done/total"}, {head: "%"}, {head: "pending", short: "pend"},
		{head: "in flight", short: "infl"}, {head: "rejected", short: "rej"}, {head: "dead"},
	}
	var fracs []float64
	add := func(label string, c monitor.CellCounts) {
		finished := c.Done + c.Rejected + c.Dead
		frac := 0.0
		if c.Total > 0 {
			frac = float64(finished) / float64(c.Total)
		}
		fracs = append(fracs, frac)
		name.cells = append(name.cells, label)
		for i, v := range []string{fmt.Sprintf("%d/%d", c.Done, c.Total), fmt.Sprintf("%.1f%%", 100*frac),
			strconv.Itoa(c.Pending), inFlightCell(r, c.InFlight), strconv.Itoa(c.Rejected), strconv.Itoa(c.Dead)} {
			cols[i].cells = append(cols[i].cells, v)
		}
	}
	for _, c := range r.Cells {
		add(c.Partition+"/"+c.Lane, c)
	}
	add("total", r.Total)
	head, rows, legend := table(name, cols, func(i, w int) string { return bar(fracs[i], w) }, width)
	out := append([]string{styleBold.Render(head)}, rows...)
	if legend != "" {
		out = append(out, styleMuted.Render(legend))
	}
	if note := strandedNote(r); note != "" {
		out = append(out, wrap(note, width, 2)...)
	}
	if r.Capture != nil { // the stage after generation: shown with the table, never dropped for height
		out = append(out, wrap("hidden states: "+r.Capture.Text(), width, 2)...)
	}
	if r.IngestErrors > 0 {
		notes = append(notes, fmt.Sprintf("bad source rows (dead letters at ingest): %d", r.IngestErrors))
	}
	if len(r.Rejects) > 0 {
		rules := make([]string, 0, len(r.Rejects))
		for _, rc := range r.Rejects {
			rules = append(rules, fmt.Sprintf("%s %d", rc.Rule, rc.N))
		}
		notes = append(notes, "rejected by rule: "+strings.Join(rules, ", "))
	}
	return out, wrapAll(notes, width, 2)
}

// rateLines are tokens/s, requests/s and samples/s with the ETA: the
// numbers first, the sparklines in the width left. With no live runner
// the rates are those of its last minutes, labelled so; now is 0.
func rateLines(s WatchSnapshot, width int) (lines []string, caption string) {
	r := s.Report
	eta := "unknown"
	switch {
	case r.ETA > 0:
		eta = fmtETA(r.ETA)
	case r.ETANote != "":
		eta = r.ETANote
	case r.State == monitor.Done:
		eta = "done"
	}
	tok := fmt.Sprintf("%.1f now (%s), %.1f over %s", r.Rate1m.TokensPerSec, windowLabel(r.Rate1m.Window, time.Minute),
		r.Rate10m.TokensPerSec, windowLabel(r.Rate10m.Window, 10*time.Minute))
	req := fmt.Sprintf("%.2f now", last(s.History.RequestsPerSec))
	earlier := r.RatesRun != nil && r.RatesRun.Earlier
	switch {
	case earlier:
		tok = fmt.Sprintf("0 now (%s); %s, %s", idleRun(r), runName(*r.RatesRun), pastRates(r, "%.1f", func(x monitor.Rate) float64 { return x.TokensPerSec }))
		req = "0.00 now"
	case noLiveRunner(r):
		how := "died"
		if r.RunnerExited {
			how = "exited"
		}
		tok = fmt.Sprintf("0 now (the runner %s); %s", how, pastRates(r, "%.1f", func(x monitor.Rate) float64 { return x.TokensPerSec }))
		req = "0.00 now"
	}
	texts := []string{"tokens/s    " + tok, "requests/s  " + req}
	textW := 0
	for _, t := range texts {
		textW = max(textW, ansi.StringWidth(t))
	}
	sparkW := min(60, width-textW-2)
	var out []string
	for i, series := range [][]float64{s.History.TokensPerSec, s.History.RequestsPerSec} {
		line := texts[i]
		if sparkW >= 10 {
			line = fmt.Sprintf("%-*s  %s", textW, line, spark(series, sparkW))
		}
		out = append(out, wrap(line, width, 12)...)
	}
	samples := fmt.Sprintf("%.2f (%s), %.2f (%s)", r.Rate1m.SamplesPerSec, windowLabel(r.Rate1m.Window, time.Minute),
		r.Rate10m.SamplesPerSec, windowLabel(r.Rate10m.Window, 10*time.Minute))
	if noLiveRunner(r) || earlier {
		samples = "0 now; " + pastRates(r, "%.2f", func(x monitor.Rate) float64 { return x.SamplesPerSec })
	}
	out = append(out, wrap(fmt.Sprintf("samples/s   %s   ETA %s", samples, eta), width, 12)...)
	if sparkW >= 10 {
		note := sparkNote(s.History, sparkW)
		if earlier {
			note += " (" + runName(*r.RatesRun) + ")"
		}
		caption = styleMuted.Render(note)
	}
	return out, caption
}

// pastRates are a gone runner's rates over its last minute and ten
// minutes (once when the run was shorter than a minute).
func pastRates(r monitor.Report, format string, of func(monitor.Rate) float64) string {
	one := fmt.Sprintf(format+" in its last %s", of(r.Rate1m), fmtWindow(r.Rate1m.Window))
	if r.Rate10m.Window == r.Rate1m.Window {
		return one
	}
	return one + fmt.Sprintf(", "+format+" in its last %s", of(r.Rate10m), fmtWindow(r.Rate10m.Window))
}

// windowLabel names a rate's window: full ("1m") once the run is older
// than it (or with no rate yet), "its first 12s" while it is younger, so a young run's rate is
// never read as a minute's.
func windowLabel(w, full time.Duration) string {
	if w <= 0 || w >= full { // 0: no rate known yet
		return fmtWindow(full)
	}
	return "its first " + fmtWindow(w)
}

// fmtWindow is a rate's window, short: 1m, 10m, 45s, 2m30s.
func fmtWindow(d time.Duration) string {
	d = d.Round(time.Second)
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	if s == "" || strings.HasSuffix(s, "h") && d%time.Minute == 0 {
		s = strings.TrimSuffix(d.String(), "0m0s")
	}
	if strings.HasSuffix(s, "m") || strings.HasSuffix(s, "h") || strings.HasSuffix(s, "s") {
		return s
	}
	return d.String()
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

// endpointLines is one line per endpoint (wrapped, never cut), each with
// its detail when detail is set. With no live runner they are as of its
// last heartbeat, muted and said so: nothing is in flight now.
func endpointLines(s WatchSnapshot, width int, detail bool) []string {
	r := s.Report
	if len(r.Endpoints) == 0 {
		return []string{styleMuted.Render("no endpoint reported yet")}
	}
	title := "endpoints"
	switch {
	case r.RunnerDied && r.Heartbeat != nil:
		title = fmt.Sprintf("endpoints when the runner died at %s (its last heartbeat; nothing is sent to them now)", r.Heartbeat.Time.Format("15:04:05"))
	case r.RunnerExited && r.Heartbeat != nil:
		title = fmt.Sprintf("endpoints when the runner exited at %s", r.Heartbeat.Time.Format("15:04:05"))
	}
	out := wrap(styleBold.Render(title), width, 2)
	for _, e := range r.Endpoints {
		out = append(out, endpointLine(r, e, width)...)
		if detail {
			out = append(out, endpointDetail(s, e, width)...)
		}
	}
	return out
}

// endpointLine is an endpoint's state, in-flight count and limit, and its
// load at the last probe; the KV bar goes first when the line is too wide.
func endpointLine(r monitor.Report, e monitor.EndpointStatus, width int) []string {
	gone := noLiveRunner(r)
	state := stateStyle(e.State).Render(string(e.State))
	inFlight := fmt.Sprintf("in flight %d", e.InFlight)
	if e.Limit > 0 {
		inFlight += fmt.Sprintf(" of limit %d", e.Limit)
	}
	if gone {
		state = "was " + string(e.State)
		inFlight += " when it " + map[bool]string{true: "died", false: "exited"}[r.RunnerDied]
	}
	build := func(kvBar bool) []string {
		parts := []string{"  " + e.URL, state, inFlight}
		if l := e.Load; l != nil {
			if l.KVUsage != nil {
				kv := fmt.Sprintf("KV %.0f%%", 100**l.KVUsage)
				if kvBar {
					kv = fmt.Sprintf("KV %s %3.0f%%", bar(*l.KVUsage, 10), 100**l.KVUsage)
				}
				parts = append(parts, kv)
			}
			if l.Queued != nil {
				parts = append(parts, fmt.Sprintf("queued %.0f", *l.Queued))
			}
			if l.Running != nil {
				parts = append(parts, fmt.Sprintf("running %.0f", *l.Running))
			}
			if note := l.StaleNote(); note != "" {
				parts = append(parts, styleMuted.Render(note))
			}
		}
		if e.Restarts > 0 {
			parts = append(parts, fmt.Sprintf("restarts %d", e.Restarts))
		}
		if h := e.Hold; h != nil && !h.Until.IsZero() {
			parts = append(parts, styleBad.Render("HELD until "+h.Until.UTC().Format("15:04:05")+" (server backpressure)"))
		} else if h != nil && h.FixedCap > 0 {
			parts = append(parts, styleBad.Render(fmt.Sprintf("capped at %d (server backpressure)", h.FixedCap)))
		}
		if e.Cause != "" {
			parts = append(parts, "("+e.Cause+")")
		}
		return parts
	}
	parts := build(true)
	if ansi.StringWidth(strings.Join(parts, "  ")) > width {
		parts = build(false)
	}
	if gone {
		for i, p := range parts {
			parts[i] = styleMuted.Render(ansi.Strip(p))
		}
	}
	return wrapParts(parts, width, 4)
}

// endpointDetail is an endpoint's since, evidence, limit and its reason,
// KV pool and load sparklines, wrapped.
func endpointDetail(s WatchSnapshot, e monitor.EndpointStatus, width int) []string {
	var out []string
	if !e.Since.IsZero() {
		out = append(out, styleMuted.Render("    since "+e.Since.Format("15:04:05")))
	}
	for _, ev := range e.Evidence {
		out = append(out, wrap("    "+ev, width, 6)...)
	}
	if e.Hold != nil {
		out = append(out, wrap(styleBad.Render("    "+e.Hold.Text()), width, 6)...)
	}
	if e.LimitReason != "" {
		out = append(out, wrap("    limit "+strconv.Itoa(e.Limit)+laneLimits(e)+": "+e.LimitReason, width, 6)...)
	}
	if e.Replays > 0 {
		out = append(out, wrap(fmt.Sprintf("    %d requests sent again after the server closed a kept-alive connection (keep-alive replays; no attempt spent)", e.Replays), width, 6)...)
	}
	if e.KVTokens > 0 {
		out = append(out, fmt.Sprintf("    KV pool %d tokens (%s)", e.KVTokens, e.KVTokensSource))
	}
	for _, h := range s.History.Endpoints {
		if h.URL != e.URL {
			continue
		}
		w := max(10, min(60, width-16))
		out = append(out, "    KV usage   "+sparkPtr(h.KVUsage, w, 1),
			"    queued     "+sparkPtr(h.Queued, w, 0),
			"    tokens/s   "+spark(h.TokensPerSec, w))
	}
	return out
}

func eventText(e monitor.Event) string {
	return e.Time.Format("15:04:05") + " " + e.Text()
}

func eventLines(s WatchSnapshot, width int) []string {
	r := s.Report
	events := s.Events
	if events == nil {
		events = r.Events
	}
	out := []string{styleBold.Render("last events")}
	if len(events) == 0 {
		out = append(out, styleMuted.Render("  none"))
	}
	for _, e := range events {
		out = append(out, wrap("  "+eventText(e), width, 4)...)
	}
	out = append(out, "", styleBold.Render("last errors"))
	if len(r.LastErrors) == 0 {
		out = append(out, styleMuted.Render("  none"))
	}
	for _, e := range r.LastErrors {
		out = append(out, wrap(fmt.Sprintf("  %s [%s] %s", e.ID, e.State, e.Reason), width, 4)...)
	}
	return out
}
