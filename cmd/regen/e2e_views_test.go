package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/regen-dev/regen/internal/monitor"
)

// longAnswersJob answers 16 prompts with about 12,000 tokens each, 8 at a
// time, at 10x simulated speed: two waves of answers that end together, so
// a chart that credits tokens when an answer completes is a sawtooth. One
// token a chunk, as SGLang and vLLM stream by default (with several, the
// endpoint's first answers are topped up when they complete: their tokens
// per chunk are not known before).
const longAnswersJob = `name: long
model: sim-model
server:
  engine: sim
  sim: {profile: fast, speed: 10, output_mean: 12000, output_sigma: 0.05, truncate_fraction: 0, seed: 3}
sources:
  - {partition: Q, path: q.jsonl, prompt: question, id: id}
lanes:
  - {name: long, concurrency: 8, max_tokens: 16384}
output:
  formats: [sharegpt]
`

// TestE2EDashboardViews (issue 30 items 3 and 4) drives headless Chromium:
// a page left open on `regen run --web` says, once the run has ended, that
// it did and how to keep a dashboard, with a grey UNKNOWN state; the
// chart of 12,000-token answers is steady (tokens counted as they stream);
// after a re-run that redid nothing, the tile and the chart show the last
// working run's figures, labelled so; times are UTC and the x axis ticks
// on whole buckets.
func TestE2EDashboardViews(t *testing.T) {
	t.Parallel()
	bctx := startBrowser(t)
	dir := t.TempDir()
	var rows strings.Builder
	for i := range 16 {
		fmt.Fprintf(&rows, `{"id":"q%02d","question":"Question %d: write a long essay on write-ahead logging."}`+"\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "q.jsonl"), []byte(rows.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(longAnswersJob), 0o644); err != nil {
		t.Fatal(err)
	}
	runner := startRegen(t, dir, "run", "job.yaml", "--web", "127.0.0.1:0")
	if !runner.waitLine("regen: dashboard at ") {
		t.Fatalf("run --web printed no dashboard address:\n%s", runner.wait(t))
	}
	base := dashboardURL.FindStringSubmatch(runner.stdout())[1]
	tab, closeTab := chromedp.NewContext(bctx)
	defer closeTab()
	if _, err := chromedp.Run(tab, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	p := page{t: t, ctx: tab}
	run(p, "open the run's dashboard", chromedp.Navigate(base+"/"))
	run(p, "first status", chromedp.Poll[bool](`!!document.body.dataset.statusAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
	if res := runner.wait(t); res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res)
	}
	checkRunPageEnded(t, p)

	// The same job through a dashboard that outlives runs.
	watch := startRegen(t, dir, "watch", "job.yaml", "--web", "127.0.0.1:0", "--every", "1h")
	defer func() {
		_ = watch.cmd.Process.Signal(os.Interrupt)
		watch.wait(t)
	}()
	watchBase := waitWatchURL(t, watch)
	checkSteadyChart(t, watchBase)
	run(p, "open the watch dashboard", chromedp.Navigate(watchBase+"/#overview"))
	run(p, "history", chromedp.Poll[bool](`!!document.body.dataset.statusAt && !!document.body.dataset.historyAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
	checkTimeAxis(t, p)
	p.screenshot("long-answers-steady")

	// A re-run that redoes nothing: the page shows the working run.
	if res := regen(t, dir, "run", "job.yaml"); res.code != 0 {
		t.Fatalf("re-run: exit %d\n%s", res.code, res)
	}
	rep, _ := status(t, dir, "job.yaml")
	if rep.RatesRun == nil || !rep.RatesRun.Earlier || rep.Rate1m.Window < 5*time.Second || rep.Rate1m.TokensPerSec <= 0 {
		t.Fatalf("status after a no-op re-run: rates_run %+v, rate_1m %+v; want the earlier run's, over its seconds", rep.RatesRun, rep.Rate1m)
	}
	run(p, "reload", chromedp.Navigate(watchBase+"/#overview"))
	run(p, "history", chromedp.Poll[bool](`!!document.body.dataset.statusAt && !!document.body.dataset.historyAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
	checkNoOpPage(t, p, rep)
	p.screenshot("noop-rerun")
	checkHoldOnPage(t, p)
}

// checkHoldOnPage: an endpoint's backpressure hold and keep-alive replays
// (issue 30 item 8) are in its row's cause, drawn from a status document
// that has them.
func checkHoldOnPage(t *testing.T, p page) {
	t.Helper()
	cause := run(p, "held endpoint", chromedp.Evaluate[string](`(() => {
		const x = new XMLHttpRequest(); x.open("GET", "/api/status", false); x.send();
		const doc = JSON.parse(x.responseText);
		doc.runner_exited = false; doc.runner_died = false;
		doc.endpoints = [{url: "http://127.0.0.1:1", state: "READY", in_flight: 1, limit: 8, replays: 3, evidence: [], lanes: [],
			hold: {since: "2026-12-06T01:02:03Z", until: "2026-12-06T01:02:05Z", reason: "backpressure (HTTP 429): Too Many Requests (Retry-After 2s)", fixed_cap: 1}}];
		applyStatus(doc);
		return document.querySelector("#endpoints tbody tr").cells[10].textContent; })()`))
	want := "held by the server since 01:02:03 until 01:02:05 UTC: backpressure (HTTP 429): Too Many Requests (Retry-After 2s); fixed lanes capped at 1 requests, one more per answer; 3 keep-alive replays"
	if cause != want {
		t.Errorf("held endpoint's cause cell = %q, want %q", cause, want)
	}
}

// checkRunPageEnded: the page of a `regen run --web` that ended says so.
func checkRunPageEnded(t *testing.T, p page) {
	t.Helper()
	run(p, "the page notices its server is gone", chromedp.Poll[bool](`document.getElementById("state").textContent === "UNKNOWN" && !document.getElementById("gone-banner").hidden`,
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	banner := p.text("gone-banner")
	for _, want := range []string{"served by regen run (pid ", "has exited", "regen watch job.yaml --web 127.0.0.1:"} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner %q lacks %q", banner, want)
		}
	}
	if cls := run(p, "state class", chromedp.Evaluate[string](`getComputedStyle(document.getElementById("state")).backgroundColor`)); cls == "rgb(31, 138, 76)" {
		t.Errorf("the lost connection's state badge is green (%s)", cls)
	}
	if u := p.text("updated"); !strings.Contains(u, "connection lost at ") || !strings.Contains(u, " UTC") {
		t.Errorf("#updated = %q, want the loss with its UTC time", u)
	}
	p.screenshot("run-web-ended")
}

func waitWatchURL(t *testing.T, watch *proc) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := dashboardURL.FindStringSubmatch(watch.stderr.String()); m != nil {
			return m[1]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("watch --web printed no dashboard address:\n%s", watch.stderr.String())
	return ""
}

// checkSteadyChart: between the run's first and last buckets no 5 s
// bucket of the tokens/s series is near zero: tokens are counted as
// they stream, not when 12,000-token answers complete.
func checkSteadyChart(t *testing.T, base string) {
	t.Helper()
	var h monitor.History
	httpGet(t, base+"/api/history", &h)
	if h.BucketSeconds != 5 || len(h.TokensPerSec) < 6 {
		t.Fatalf("history of %d buckets of %gs; want 5 s buckets over the run", len(h.TokensPerSec), h.BucketSeconds)
	}
	inner := h.TokensPerSec[1 : len(h.TokensPerSec)-2] // the first and last are partial
	top := slices.Max(inner)
	low := slices.Min(inner)
	t.Logf("tokens/s per 5 s bucket: %.0f", h.TokensPerSec)
	if low < top/4 {
		t.Errorf("tokens/s per bucket from %.0f to %.0f: a sawtooth, not a steady stream (%.0f)", low, top, h.TokensPerSec)
	}
}

// checkTimeAxis: the chart's x ticks are whole buckets apart, labelled
// HH:MM:SS in UTC, never fractions of a second.
func checkTimeAxis(t *testing.T, p page) {
	t.Helper()
	ax := run(p, "x axis", chromedp.Evaluate[map[string]any](`(() => { const a = charts["chart-throughput"].axes[0];
		return {splits: a._splits, values: a._values, label: a.label}; })()`))
	splits, _ := ax["splits"].([]any)
	for i := 1; i < len(splits); i++ {
		if d := splits[i].(float64) - splits[i-1].(float64); d < 5 || int(d*1000)%5000 != 0 {
			t.Errorf("x ticks %v: %g s apart; want whole 5 s buckets", splits, d)
		}
	}
	if len(splits) < 2 {
		t.Errorf("x ticks %v: fewer than two", splits)
	}
	vals, _ := ax["values"].([]any)
	for _, v := range vals {
		if s, _ := v.(string); len(s) != 8 || s[2] != ':' || s[5] != ':' {
			t.Errorf("x tick label %q, want HH:MM:SS", v)
		}
	}
	if ax["label"] != "time (UTC)" {
		t.Errorf("x axis label %q, want time (UTC)", ax["label"])
	}
}

// checkNoOpPage: after a re-run that redid nothing, the tile and the
// chart are the working run's, labelled with its pid; the chart is drawn.
func checkNoOpPage(t *testing.T, p page, rep monitor.Report) {
	t.Helper()
	want := fmt.Sprintf("0 now (the newest run, pid %d, sent nothing)", rep.RatesRun.IdlePID)
	// The stream's next status after the re-run.
	run(p, "the re-run's status", chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("rate-tokens").textContent.startsWith(%q)`, want),
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	tile := p.text("rate-tokens")
	if !strings.HasPrefix(tile, want) || !strings.Contains(tile, fmt.Sprintf("the last working run's, pid %d", rep.RatesRun.PIDs[0])) {
		t.Errorf("tok/s tile %q, want %q and the working run's rate", tile, want)
	}
	if note := p.text("chart-note"); !strings.Contains(note, "the charts show the last run that did work") {
		t.Errorf("chart note %q", note)
	}
	pixels := run(p, "chart pixels", chromedp.Poll[map[string]int](`(() => { const c = `+chartPixels+`; return c["chart-throughput"] > 0 ? c : null; })()`,
		chromedp.WithPollingInterval(250*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	t.Logf("coloured chart pixels after a no-op re-run: %v", pixels)
}
