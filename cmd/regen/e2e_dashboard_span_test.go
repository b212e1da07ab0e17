package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/stats"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
	"github.com/regen-dev/regen/internal/web"
)

// spanJob is a store holding what a runner of the given age left: history
// rows in the runner's slots (5 s in its first hour, minutes after) for
// two endpoints, 30 done samples in B1_glaive/short and a lane,
// B2_opencode/long, of 11 rejects and nothing done. staleFor ages the
// second endpoint's last server reading.
func spanJob(t *testing.T, age, staleFor time.Duration) store.Store {
	t.Helper()
	return spanJobUntil(t, age, staleFor, time.Now())
}

// spanJobUntil is spanJob with the runner's last heartbeat (and its last
// history slot) at now.
func spanJobUntil(t *testing.T, age, staleFor time.Duration, now time.Time) store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "span.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var in []store.NewSample
	for i := range 40 {
		in = append(in, store.NewSample{ID: fmt.Sprintf("B1_glaive/%03d", i), Partition: "B1_glaive", Lane: "short", Body: []byte(`{"messages":[{"role":"user","content":"q"}]}`), Origin: fmt.Sprintf("g.jsonl:%d", i+1)})
	}
	for i := range 11 {
		in = append(in, store.NewSample{ID: fmt.Sprintf("B2_opencode/%03d", i), Partition: "B2_opencode", Lane: "long", Body: []byte(`{"messages":[{"role":"user","content":"q"}]}`), Origin: fmt.Sprintf("o.jsonl:%d", i+1)})
	}
	if _, err := st.Ingest(ctx, in); err != nil {
		t.Fatal(err)
	}
	res := store.Result{Response: []byte(`{"content":"a"}`), FinishReason: "length", PromptTokens: 5, CompletionTokens: 300, Endpoint: "http://127.0.0.1:30000", Generation: 1}
	for lane, n := range map[string]int{"short": 30, "long": 11} {
		claimed, err := st.Claim(ctx, lane, n, "w", time.Hour)
		if err != nil || len(claimed) != n {
			t.Fatalf("claim %d of %s: %d, %v", n, lane, len(claimed), err)
		}
		for _, c := range claimed {
			if lane == "long" {
				err = st.Reject(ctx, c.ID, "w", res, "truncated", "finish_reason length")
			} else {
				err = st.Complete(ctx, c.ID, "w", res)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	started := now.Add(-age)
	kv, queued, running := 0.62, 3.0, 40.0
	load := func(at time.Time) *monitor.Load {
		// A probe interval of 30 s keeps the first reading fresh however
		// slowly a loaded machine gets to the check; the second is older.
		return &monitor.Load{At: at, Every: 30 * time.Second, KVUsage: &kv, Queued: &queued, Running: &running}
	}
	beat, _ := json.Marshal(monitor.Beat{State: monitor.Running, Endpoints: []monitor.EndpointStatus{
		{URL: "http://127.0.0.1:30000", State: monitor.Ready, InFlight: 40, Limit: 64, Load: load(now.Add(-time.Second))},
		{URL: "http://127.0.0.1:30001", State: monitor.Ready, InFlight: 182, Limit: 182, Load: load(now.Add(-staleFor))},
	}})
	if err := st.PutHeartbeat(ctx, store.Heartbeat{Owner: "w", PID: 1, Host: "elsewhere", Time: now, Started: started, Counters: beat}); err != nil {
		t.Fatal(err)
	}
	var rows []store.Minute
	for at := started; !at.After(now); {
		slot, w := stats.SlotAt(at, started)
		i := float64(slot.Sub(started) / w)
		// The current slot holds what its elapsed part did, as the runner's does.
		part := min(now.Sub(slot).Seconds(), w.Seconds())
		tokens := int64((2000 + 800*float64(int(i)%7)) * part)
		reqs := int64(part * 0.5)
		rows = append(rows, store.Minute{Time: slot, Worker: "w", Tokens: 2 * tokens, Requests: 2 * reqs, Samples: int(reqs / 2), KVUsage: -1, Queued: -1, Running: -1})
		for j, url := range []string{"http://127.0.0.1:30000", "http://127.0.0.1:30001"} {
			rows = append(rows, store.Minute{Time: slot, Worker: "w", Endpoint: url, Tokens: tokens, Requests: reqs,
				InFlight: 30 + 10*j + int(i)%5, KVUsage: 0.3 + 0.1*float64(j) + 0.05*float64(int(i)%6), Queued: float64(int(i) % 4), Running: 30, Limit: 64})
		}
		at = slot.Add(w)
	}
	if err := st.PutMinutes(ctx, rows); err != nil {
		t.Fatal(err)
	}
	return st
}

// staleNote is a reading taken 40 s before the test's clock started: its
// age grows with the wall time the page takes to load (50 s seen on a
// loaded machine), so any age from 40 s up passes.
var staleNote = regexp.MustCompile(`\(read ([4-9]\d|[1-9]\d{2,})s ago\)`)

// chartSpan is, for each chart, where its first and last bucket holding
// a drawn value sit across the plot (0 = left edge, 1 = right edge).
const chartSpan = `(() => {
  const out = {};
  for (const id of ["chart-throughput", "chart-load"]) {
    const u = charts[id];
    if (!u) return null;
    const xs = u.data[0];
    let first = -1, last = -1;
    for (let i = 0; i < xs.length; i++) {
      if (u.data.slice(1).some((s) => s[i] !== null && s[i] !== undefined && s[i] > 0)) { if (first < 0) first = i; last = i; }
    }
    if (first < 0) return null;
    const w = u.bbox.width / devicePixelRatio;
    out[id] = { first: u.valToPos(xs[first], "x") / w, last: u.valToPos(xs[last], "x") / w, buckets: xs.length };
  }
  return out;
})()`

// openDashboard serves the dashboard of st with report and opens it in a
// new tab of the browser; it returns the page and the server's address.
func openDashboard(t *testing.T, bctx context.Context, st store.Store, report func(context.Context) (monitor.Report, error)) (page, string) {
	t.Helper()
	srv, err := web.New(web.Options{Store: st, Report: report, Every: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	tab, closeTab := chromedp.NewContext(bctx)
	t.Cleanup(closeTab)
	if _, err := chromedp.Run(tab, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	p := page{t: t, ctx: tab}
	run(p, "open the dashboard", chromedp.Navigate(hs.URL+"/"))
	return p, hs.URL
}

// TestE2EDashboardSpansTheJob drives headless Chromium over the dashboard
// of a job a minute old and of one two hours old: both charts start at the
// job's start and end at its last reading (the first drawn bucket at the
// left edge, not one bar at the right of an hour), the lane of 11 rejects
// is drawn in the rejects' colour with a link listing them, a stale server
// reading says its age, and the samples page takes its filters from the
// address. With REGEN_SCREENSHOTS set it saves the overviews there.
func TestE2EDashboardSpansTheJob(t *testing.T) {
	t.Parallel()
	bctx := startBrowser(t)
	for _, c := range []struct {
		name        string
		age         time.Duration
		wantBuckets int // at most
		wantBucket  float64
	}{
		{"1min", time.Minute, 14, 5},
		{"2h", 2 * time.Hour, 25, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := spanJob(t, c.age, 40*time.Second)
			report := func(ctx context.Context) (monitor.Report, error) {
				return monitor.Assess(ctx, st, monitor.AssessOptions{Job: "span-" + c.name, Now: time.Now(), DeadAfter: time.Hour})
			}
			p, base := openDashboard(t, bctx, st, report)
			run(p, "first status", chromedp.Poll[bool](`!!document.body.dataset.statusAt && !!document.body.dataset.historyAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
			span := run(p, "chart span", chromedp.Poll[map[string]map[string]float64](chartSpan, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
			for id, s := range span {
				if s["first"] > 0.05 || s["last"] < 0.95 || s["buckets"] > float64(c.wantBuckets) || s["buckets"] < 2 {
					t.Errorf("%s of a %s job: drawn from %.2f to %.2f of its width in %v buckets; want from the left edge to the right in at most %d",
						id, c.age, s["first"], s["last"], s["buckets"], c.wantBuckets)
				}
			}
			var h monitor.History
			httpGet(t, base+"/api/history", &h)
			if h.BucketSeconds != c.wantBucket {
				t.Errorf("history of a %s job in buckets of %v s, want %v", c.age, h.BucketSeconds, c.wantBucket)
			}

			// The lane of 11 rejects and no done sample: no done segment, a
			// full rejects segment, and its count links to those samples.
			lane := run(p, "rejects lane", chromedp.Evaluate[map[string]string](`(() => {
				const r = document.querySelector('#cells tr[data-cell="B2_opencode/long"]');
				const bar = r.cells[2];
				const a = r.cells[7].querySelector("a");
				return { done: bar.querySelector(".done").style.width, rejected: bar.querySelector(".rejected").style.width,
					colour: getComputedStyle(bar.querySelector(".rejected")).backgroundColor,
					doneColour: getComputedStyle(document.querySelector('#cells tr[data-cell="B1_glaive/short"] .done')).backgroundColor,
					href: a ? a.getAttribute("href") : "" };
			})()`))
			if lane["done"] != "0%" || lane["rejected"] != "100%" || lane["colour"] == lane["doneColour"] ||
				lane["href"] != "#samples?state=rejected&partition=B2_opencode&lane=long" {
				t.Errorf("lane of 11 rejects drawn as %v; want an empty done segment, a full rejects segment of another colour, and a link to its rejects", lane)
			}
			// The stale reading of the second endpoint says its age.
			if eps := p.text("endpoints"); len(staleNote.FindAllString(eps, -1)) != 3 || strings.Count(eps, "ago)") != 3 {
				t.Errorf("endpoint table = %q; want the second endpoint's three figures read 40 s or more ago, the first's fresh", eps)
			}
			p.screenshot("dashboard-" + c.name)

			// Following the link lists the lane's rejects, its filters in
			// the address and on the page.
			run(p, "follow the rejects link", chromedp.Evaluate[chromedp.Void](`document.querySelector('#cells tr[data-cell="B2_opencode/long"] td:nth-child(8) a').click()`))
			listed := run(p, "rejects listed", chromedp.Poll[[]string](`(() => {
				const rows = [...document.querySelectorAll("#samples tbody tr")].map((r) => r.cells[0].textContent + " " + r.cells[3].textContent);
				return rows.length === 11 ? rows : null;
			})()`, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
			filters := run(p, "filters", chromedp.Evaluate[[]string](`["state", "partition", "lane", "rule", "generation"].map((k) => document.getElementById("samples-" + k).value)`))
			if listed[0] != "B2_opencode/000 rejected" || strings.Join(filters, ",") != "rejected,B2_opencode,long,," {
				t.Errorf("after the link: rows %v, filters %v; want the 11 rejects of B2_opencode/long", listed, filters)
			}
			// Every filter is a query parameter: an address alone sets them.
			run(p, "open a filtered address", chromedp.Navigate(base+"/#samples?state=done&generation=1&lane=short"))
			got := run(p, "filtered list", chromedp.Poll[[]string](`(() => {
				const f = ["state", "lane", "generation"].map((k) => document.getElementById("samples-" + k).value).join(",");
				const n = document.querySelectorAll("#samples tbody tr").length;
				return f === "done,short,1" && n === 30 ? [f, String(n)] : null;
			})()`, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
			t.Logf("filtered address: filters %s, %s rows", got[0], got[1])
			// Changing a filter writes it into the address.
			href := run(p, "change a filter", chromedp.Evaluate[string](`(() => {
				const s = document.getElementById("samples-generation"); s.value = ""; s.dispatchEvent(new Event("change"));
				return location.hash;
			})()`))
			if href != "#samples?state=done&lane=short" {
				t.Errorf("address after clearing the generation = %q, want #samples?state=done&lane=short", href)
			}
		})
	}
}
