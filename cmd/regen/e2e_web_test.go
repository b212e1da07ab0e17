package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The browser is started once for the package and closed by TestMain.
var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
	turn   sync.Mutex // one test drives the browser at a time
}

// startBrowser returns the package's browser, started on first use, and
// holds it for t until t ends: the tests run in parallel (issue 30), but
// one page at a time, so no tab is a background tab whose timers the
// browser slows.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	path := needTool(t, "chromium", "chromium")
	browser.turn.Lock()
	t.Cleanup(browser.turn.Unlock)
	browser.once.Do(func() {
		dir, err := os.MkdirTemp("", "regen-chromium-")
		if err != nil {
			browser.err = err
			return
		}
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
			chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
			chromedp.UserDataDir(dir), chromedp.WindowSize(1400, 1800))
		actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, bcancel := chromedp.NewContext(actx)
		// The first Run starts the browser.
		if _, err := chromedp.Run(bctx, chromedp.Navigate("about:blank")); err != nil {
			browser.err = fmt.Errorf("start chromium: %w", err)
		}
		browser.ctx = bctx
		browser.cancel = func() { bcancel(); acancel(); os.RemoveAll(dir) }
	})
	if browser.err != nil {
		t.Fatal(browser.err)
	}
	return browser.ctx
}

func stopBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
}

// page runs browser actions with a deadline, failing the test on error.
type page struct {
	t   *testing.T
	ctx context.Context
}

func run[T any](p page, what string, a chromedp.Action[T]) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		dctx, dcancel := context.WithTimeout(p.ctx, 5*time.Second)
		defer dcancel()
		state, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`JSON.stringify(document.body.dataset) + " " + document.getElementById("updated").textContent + " " + location.href`))
		p.t.Logf("page state: %s", state)
		p.t.Fatalf("browser: %s: %v", what, err)
	}
	return v
}

func (p page) text(id string) string {
	p.t.Helper()
	return run(p, "text of #"+id, chromedp.Evaluate[string](fmt.Sprintf(`document.getElementById(%q).textContent`, id)))
}

// screenshot saves the page where $REGEN_SCREENSHOTS names a folder.
func (p page) screenshot(name string) {
	p.t.Helper()
	dir := os.Getenv("REGEN_SCREENSHOTS")
	if dir == "" {
		return
	}
	png := run(p, "screenshot", chromedp.FullScreenshot(100))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// chartPixels counts the coloured (series) pixels drawn in each chart's
// canvas: grid and axes are grey, so a chart that drew nothing counts 0.
const chartPixels = `(() => {
  const out = {};
  for (const id of ["chart-throughput", "chart-load"]) {
    const c = document.querySelector("#" + id + " canvas");
    if (!c || !c.width) { out[id] = -1; continue; }
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 0 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 60) n++;
    }
    out[id] = n;
  }
  return out;
})()`

func httpGet(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", url, resp.StatusCode, b)
	}
	if s, ok := v.(*string); ok {
		*s = string(b)
		return
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, b)
	}
}

var dashboardURL = regexp.MustCompile(`dashboard at (http://127\.0\.0\.1:\d+)/`)

// TestE2EDashboard drives headless Chromium against the demo job: while it
// runs (regen run --web) the page loads, both charts draw, a sample is
// found by id and /metrics carries the runner's request metrics; after the
// runner stops, a watch-only dashboard (regen watch --web, no runner) shows
// exactly the numbers `regen status --json` prints.
func TestE2EDashboard(t *testing.T) {
	t.Parallel()
	bctx := startBrowser(t)
	dir := t.TempDir()
	copyExample(t, "demo/data", filepath.Join(dir, "data"))
	job, err := os.ReadFile("../../examples/demo/job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Slower than the demo's default, so the job is still running while the browser looks.
	job = []byte(strings.Replace(string(job), "speed: 40 ", "speed: 10 ", 1))
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), job, 0o644); err != nil {
		t.Fatal(err)
	}
	runner := startRegen(t, dir, "run", "job.yaml", "--web", "127.0.0.1:0", "--drain-timeout", "2s")
	if !runner.waitLine("regen: dashboard at ") {
		t.Fatalf("run --web printed no dashboard address:\n%s", runner.wait(t))
	}
	base := dashboardURL.FindStringSubmatch(runner.stdout())[1]

	// Wait for real progress, so the charts have something to draw.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var st struct {
			State string             `json:"state"`
			Total struct{ Done int } `json:"total"`
		}
		httpGet(t, base+"/api/status", &st)
		if st.State == "RUNNING" && st.Total.Done >= 30 {
			break
		}
		if time.Now().After(deadline) || runner.exited() {
			t.Fatalf("the demo never reached 30 samples done while running (state %s, %d done)", st.State, st.Total.Done)
		}
		time.Sleep(200 * time.Millisecond)
	}

	tab, closeTab := chromedp.NewContext(bctx)
	defer closeTab()
	// The first Run opens the tab and ties it to its context: it must be
	// the tab's own, not one of run's per-step deadlines.
	if _, err := chromedp.Run(tab, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	p := page{t: t, ctx: tab}
	run(p, "open the dashboard", chromedp.Navigate(base+"/"))
	run(p, "first status", chromedp.Poll[bool](`!!document.body.dataset.statusAt && !!document.body.dataset.historyAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
	if s := p.text("state"); s != "RUNNING" {
		t.Errorf("page state = %q while the demo runs, want RUNNING", s)
	}
	pixels := run(p, "chart pixels", chromedp.Poll[map[string]int](`(() => { const c = `+chartPixels+`; return c["chart-throughput"] > 0 && c["chart-load"] > 0 ? c : null; })()`,
		chromedp.WithPollingInterval(250*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	t.Logf("coloured chart pixels while running: %v", pixels)
	p.screenshot("overview-running")

	// One runner: no workers table. Several (a PostgreSQL store): the page
	// lists them, drawn from a status document with three workers.
	if hidden := run(p, "workers box", chromedp.Evaluate[bool](`document.getElementById("workers-box").hidden`)); !hidden {
		t.Error("workers table shown for a job of one runner")
	}
	workerRows := run(p, "workers rows", chromedp.Evaluate[[][]string](`(() => {
		const x = new XMLHttpRequest(); x.open("GET", "/api/status", false); x.send();
		const doc = JSON.parse(x.responseText);
		const w = (host, pid, state, live) => ({host, pid, state, live, heartbeat_age_seconds: 2, done: 7, samples_per_sec: 1.5, in_flight: 3, lanes: [],
			endpoints: [{url: "http://127.0.0.1:1", state: live ? "READY" : "DOWN", cause: live ? "" : "exit code 137"}], evidence: []});
		doc.workers = [w("gpu-a", 11, "RUNNING", true), w("gpu-b", 22, "RUNNING", true), w("gpu-c", 33, "DEAD", false)];
		applyStatus(doc);
		if (document.getElementById("workers-box").hidden) return null;
		return [[document.getElementById("workers-title").textContent],
			...[...document.querySelectorAll("#workers tbody tr")].map(r => [...r.cells].map(c => c.textContent))];
	})()`))
	if len(workerRows) != 4 || workerRows[0][0] != "Workers: 2 live of 3" || workerRows[3][0] != "gpu-c" || workerRows[3][2] != "DEAD" ||
		!strings.Contains(workerRows[3][8], "DOWN (exit code 137)") {
		t.Errorf("workers table from a three-worker status = %q, want a title and three rows, gpu-c DEAD with its endpoint DOWN", workerRows)
	}

	// /metrics beside the run: the runner's own request metrics, parseable.
	var metrics string
	httpGet(t, base+"/metrics", &metrics)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(metrics))
	if err != nil {
		t.Fatalf("parse /metrics of regen run --web: %v", err)
	}
	for _, name := range []string{"regen_requests_total", "regen_request_duration_seconds", "regen_ttft_seconds", "regen_tokens_generated_total", "regen_samples", "regen_job_state", "regen_heartbeat_age_seconds", "regen_endpoint_state"} {
		if fams[name] == nil || len(fams[name].GetMetric()) == 0 {
			t.Errorf("/metrics of regen run --web lacks %s", name)
		}
	}

	// A sample, found by id through the page's own lookup form.
	var done struct {
		Rows []struct{ ID string } `json:"rows"`
	}
	httpGet(t, base+"/api/samples?state=done&partition=B1_glaive&limit=1", &done)
	if len(done.Rows) == 0 {
		t.Fatal("no done sample to look up")
	}
	id := done.Rows[0].ID
	run(p, "look up "+id, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector('a[data-page="samples"]').click();
		document.getElementById("lookup-id").value = %q; document.getElementById("lookup").requestSubmit();`, id)))
	run(p, "sample shown", chromedp.Poll[bool](fmt.Sprintf(`document.body.dataset.sampleShown === %q`, id)))
	if got := p.text("sample-id"); got != id {
		t.Errorf("sample page shows %q, want %q", got, id)
	}
	if turns := p.text("sample-turns"); !strings.Contains(turns, "user") || !strings.Contains(turns, "Regenerated") || !strings.Contains(turns, "127.0.0.1") {
		t.Errorf("sample %s shows no prompt, regenerated answer or endpoint: %q", id, turns)
	}
	if meta := p.text("sample-meta"); !strings.Contains(meta, "done") {
		t.Errorf("sample %s meta lacks its state: %q", id, meta)
	}
	p.screenshot("sample")

	// Stop the runner; the store no longer moves.
	if err := runner.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if res := runner.wait(t); res.code != 130 {
		t.Fatalf("interrupted run: want exit 130\n%s", res)
	}

	// A dashboard with no runner: regen watch --web, reading the store alone.
	watch := startRegen(t, dir, "watch", "job.yaml", "--web", "127.0.0.1:0", "--every", "1h")
	defer func() {
		_ = watch.cmd.Process.Signal(os.Interrupt)
		watch.wait(t)
	}()
	deadline = time.Now().Add(30 * time.Second)
	var m []string
	for m == nil && time.Now().Before(deadline) {
		m = dashboardURL.FindStringSubmatch(watch.stderr.String())
		time.Sleep(50 * time.Millisecond)
	}
	if m == nil {
		t.Fatalf("watch --web printed no dashboard address:\n%s", watch.stderr.String())
	}
	run(p, "open the watch dashboard", chromedp.Navigate(m[1]+"/#overview"))
	run(p, "status", chromedp.Poll[bool](`!!document.body.dataset.statusAt && !!document.body.dataset.historyAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
	rep, res := status(t, dir, "job.yaml")
	if res.code != 2 {
		t.Errorf("status of a stopped job: exit %d, want 2\n%s", res.code, res)
	}
	// /api/status is the document status --json prints, but for what
	// depends on the moment it was made: its time, the heartbeat's and each
	// worker's age (also in the evidence) and the rate windows ending then.
	var apiDoc, cliDoc map[string]any
	httpGet(t, m[1]+"/api/status", &apiDoc)
	if err := json.Unmarshal([]byte(res.stdout), &cliDoc); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []map[string]any{apiDoc, cliDoc} {
		for _, k := range []string{"time", "evidence", "rate_1m", "rate_10m"} {
			delete(doc, k)
		}
		if hb, ok := doc["heartbeat"].(map[string]any); ok {
			delete(hb, "age_ns")
			delete(hb, "age_seconds")
		}
		// A server reading's age is as of the document's time too.
		endpoints, _ := doc["endpoints"].([]any)
		for _, e := range endpoints {
			if l, ok := e.(map[string]any)["load"].(map[string]any); ok {
				delete(l, "age_ns")
				delete(l, "age_seconds")
				delete(l, "stale")
			}
		}
		workers, _ := doc["workers"].([]any)
		for _, w := range workers {
			if w, ok := w.(map[string]any); ok {
				delete(w, "heartbeat_age_ns")
				delete(w, "heartbeat_age_seconds")
			}
		}
	}
	if diff := cmp.Diff(cliDoc, apiDoc); diff != "" {
		t.Errorf("/api/status differs from status --json (-cli +api):\n%s", diff)
	}
	want := map[string]string{
		"state":           string(rep.State),
		"total-total":     fmt.Sprint(rep.Total.Total),
		"total-done":      fmt.Sprint(rep.Total.Done),
		"total-pending":   fmt.Sprint(rep.Total.Pending),
		"total-in_flight": fmt.Sprint(rep.Total.InFlight),
		"total-rejected":  fmt.Sprint(rep.Total.Rejected),
		"total-dead":      fmt.Sprint(rep.Total.Dead),
		"ingest-errors":   fmt.Sprint(rep.IngestErrors),
	}
	for id, w := range want {
		if got := p.text(id); got != w {
			t.Errorf("page #%s = %q, status --json says %q", id, got, w)
		}
	}
	cells := run(p, "progress rows", chromedp.Evaluate[[][]string](`[...document.querySelectorAll("#cells tbody tr")].map(r => [...r.cells].map(c => c.textContent))`))
	var wantCells [][]string
	for _, c := range rep.Cells {
		wantCells = append(wantCells, []string{c.Partition, c.Lane, "", fmt.Sprint(c.Done), fmt.Sprint(c.Total), fmt.Sprint(c.Pending),
			fmt.Sprint(c.InFlight), fmt.Sprint(c.Rejected), fmt.Sprint(c.Dead)})
	}
	if fmt.Sprint(cells) != fmt.Sprint(wantCells) {
		t.Errorf("progress table %v, status --json cells %v", cells, wantCells)
	}
	// The page reads the v1 document's keys: the ETA's absence with its
	// reason, the events, the endpoints as the runner last saw them.
	if rep.ETA != 0 || rep.ETANote == "" {
		t.Errorf("status of a stopped job: ETA %s, note %q; want no ETA and a reason", rep.ETA, rep.ETANote)
	}
	if got := p.text("eta"); got != rep.ETANote {
		t.Errorf("page ETA %q, status --json eta_note %q", got, rep.ETANote)
	}
	events := run(p, "last events", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#last-events li")].map(li => li.textContent)`))
	if len(events) != len(rep.Events) || len(events) == 0 {
		t.Errorf("page shows %d last events %q, status --json has %d", len(events), events, len(rep.Events))
	}
	for i := range min(len(events), len(rep.Events)) {
		e := rep.Events[i]
		// The page prints events as status does: no stray space for an
		// event without a state ("ingest job: 603 rows ...").
		if want := " " + e.Text(); !strings.HasSuffix(events[i], want) || strings.Contains(events[i], "undefined") {
			t.Errorf("page event %d %q, status --json %+v", i, events[i], e)
		}
	}
	var rejects []string
	for _, rc := range rep.Rejects {
		rejects = append(rejects, fmt.Sprintf("%s %d", rc.Rule, rc.N))
	}
	if want := strings.Join(rejects, ", "); !strings.HasSuffix(p.text("rejects"), want) || (want == "") != (p.text("rejects") == "") {
		t.Errorf("page rejects %q, status --json rejects %v", p.text("rejects"), rep.Rejects)
	}
	endpoints := run(p, "endpoint rows", chromedp.Evaluate[[][]string](`[...document.querySelectorAll("#endpoints tbody tr")].map(r => [...r.cells].slice(0, 2).map(c => c.textContent))`))
	var wantEndpoints [][]string
	for _, e := range rep.Endpoints {
		wantEndpoints = append(wantEndpoints, []string{e.URL, string(e.State)})
	}
	if fmt.Sprint(endpoints) != fmt.Sprint(wantEndpoints) {
		t.Errorf("endpoint table %v, status --json endpoints %v", endpoints, wantEndpoints)
	}
	if rep.Total.Done < 30 || rep.Total.Done == rep.Total.Total {
		t.Errorf("the comparison should be of a job stopped half way; it had %d of %d done", rep.Total.Done, rep.Total.Total)
	}
	pixels = run(p, "chart pixels after restart", chromedp.Poll[map[string]int](`(() => { const c = `+chartPixels+`; return c["chart-throughput"] > 0 ? c : null; })()`))
	t.Logf("coloured chart pixels from the store's history with no runner: %v", pixels)
	p.screenshot("overview-stopped")
	for _, pg := range []string{"events", "failed", "samples"} {
		run(p, "open "+pg, chromedp.Evaluate[chromedp.Void](`location.hash = "`+pg+`"`))
		run(p, pg+" rows", chromedp.Poll[bool](`document.querySelector("#page-`+pg+` table tbody tr") !== null`))
		p.screenshot(pg)
	}
	if bad := p.text("bad-count"); bad != fmt.Sprint(rep.IngestErrors) {
		t.Errorf("bad source rows on the page %s, status says %d", bad, rep.IngestErrors)
	}
}
