package main

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/regen-dev/regen/internal/monitor"
)

// pastRate is a rate tile of a gone runner: 0 now, then its last rate.
var pastRate = regexp.MustCompile(`^0 now \(the runner died\)(\d+\.\d+) in its last (\S+)$`)

// TestE2EDashboardRunnerDied drives headless Chromium over the dashboard
// of a job whose runner was killed two minutes ago, and of the same job
// with the runner live: as `regen status` and `regen watch` do, the dead
// runner's endpoints are titled "when the runner died at T", greyed, with
// their in-flight counts "when it died", and the rate tiles say 0 now with
// the rate of its last minute beside, and its 5 leases are "(5)", not in
// flight; the live runner's are plain.
func TestE2EDashboardRunnerDied(t *testing.T) {
	t.Parallel()
	bctx := startBrowser(t)
	for _, c := range []struct {
		name string
		ago  time.Duration // of the last heartbeat
		died bool
	}{
		{"live", 0, false},
		{"died", 2 * time.Minute, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := spanJobUntil(t, 10*time.Minute, 0, time.Now().Add(-c.ago))
			// The runner holds 5 leases: in flight while it lives, stranded
			// once it died.
			if got, err := st.Claim(context.Background(), "short", 5, "w", time.Hour); err != nil || len(got) != 5 {
				t.Fatalf("claim 5: %d, %v", len(got), err)
			}
			report := func(ctx context.Context) (monitor.Report, error) {
				return monitor.Assess(ctx, st, monitor.AssessOptions{Job: "died", Now: time.Now(), DeadAfter: 30 * time.Second})
			}
			r, err := report(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if r.RunnerDied != c.died || r.Heartbeat == nil {
				t.Fatalf("report: runner_died %v, heartbeat %v; want %v and one", r.RunnerDied, r.Heartbeat, c.died)
			}
			p, _ := openDashboard(t, bctx, st, report)
			run(p, "first status", chromedp.Poll[bool](`!!document.body.dataset.statusAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
			got := run(p, "endpoints and rates", chromedp.Evaluate[map[string]string](fmt.Sprintf(`(() => {
				const ep = document.querySelector("#endpoints tbody tr");
				return { title: document.getElementById("endpoints-title").textContent,
					hb: new Date(%q).toISOString().slice(11, 19), // UTC, 24-hour: the page's one convention
					state: ep.cells[1].textContent, inFlight: ep.cells[3].textContent,
					colour: getComputedStyle(ep.cells[0]).color,
					cellsColour: getComputedStyle(document.querySelector("#cells tbody td")).color,
					leased: document.getElementById("total-in_flight").textContent,
					cellLeased: document.querySelector('#cells tr[data-cell="B1_glaive/short"]').cells[6].textContent,
					stranded: document.getElementById("stranded").textContent,
					tokens: document.getElementById("rate-tokens").textContent,
					samples: document.getElementById("rate-samples").textContent };
			})()`, r.Heartbeat.Time.Format(time.RFC3339Nano))))
			p.screenshot("dashboard-runner-" + c.name)
			if !c.died {
				plain := regexp.MustCompile(`^\d+\.\d+$`)
				if got["title"] != "Endpoints" || got["state"] != "READY" || got["inFlight"] != "40" || got["colour"] != got["cellsColour"] ||
					!plain.MatchString(got["tokens"]) || !plain.MatchString(got["samples"]) ||
					got["leased"] != "5" || got["cellLeased"] != "5" || got["stranded"] != "" {
					t.Errorf("live runner's dashboard: %v; want a plain Endpoints table, READY, 40 in flight, plain rates and 5 samples in flight", got)
				}
				return
			}
			wantTitle := "Endpoints when the runner died at " + got["hb"] + " (its last heartbeat; nothing is sent to them now)"
			if got["title"] != wantTitle {
				t.Errorf("endpoints title = %q, want %q", got["title"], wantTitle)
			}
			// The state is the one it had then, as status prints it; the
			// title, the grey and the in-flight count say it is the past.
			if got["state"] != "READY" || got["inFlight"] != "40 when it died" || got["colour"] == got["cellsColour"] {
				t.Errorf("dead runner's endpoint: state %q, in flight %q, colour %s (progress table %s); want READY, 40 when it died, greyed",
					got["state"], got["inFlight"], got["colour"], got["cellsColour"])
			}
			// Its leases are not in flight, as status prints them.
			wantStranded := "(5): leased by the runner that died at " + got["hb"] + ", not in flight; they go back to pending when the job runs again"
			if got["leased"] != "(5)" || got["cellLeased"] != "(5)" || got["stranded"] != wantStranded {
				t.Errorf("dead runner's leases: tile %q, cell %q, note %q; want (5), (5) and %q", got["leased"], got["cellLeased"], got["stranded"], wantStranded)
			}
			for _, tile := range []struct {
				name, text string
				rate       float64
				format     string
			}{
				{"tok/s", got["tokens"], r.Rate1m.TokensPerSec, "%.1f"},
				{"samples/s", got["samples"], r.Rate1m.SamplesPerSec, "%.2f"},
			} {
				m := pastRate.FindStringSubmatch(tile.text)
				if m == nil || m[1] != fmt.Sprintf(tile.format, tile.rate) || tile.rate == 0 {
					t.Errorf("%s tile = %q; want 0 now (the runner died) then %s in its last minute (status: %v over %s)",
						tile.name, tile.text, fmt.Sprintf(tile.format, tile.rate), tile.rate, r.Rate1m.Window)
				}
			}
		})
	}
}
