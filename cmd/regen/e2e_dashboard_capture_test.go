package main

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestE2EDashboardCapture drives headless Chromium over the dashboard of
// a job whose hidden-state capture is under way: the Hidden states
// section shows captured of total, dead, in flight, to retry and the
// bytes, as regen status does; for a job without a capture section the
// section stays hidden.
func TestE2EDashboardCapture(t *testing.T) {
	t.Parallel()
	bctx := startBrowser(t)
	total := 2000
	for _, c := range []struct {
		name    string
		capture *monitor.CaptureProgress
		want    map[string]string
	}{
		{"capturing", &monitor.CaptureProgress{Total: &total, Captured: 1234, Dead: 3, InFlight: 4, Pending: 5, Bytes: 12_300_000_000, Tokens: 99},
			map[string]string{"hidden": "false", "captured": "1,234", "total": "2,000", "dead": "3", "inFlight": "4", "pending": "5", "bytes": "12 GB"}},
		{"not counted", &monitor.CaptureProgress{Captured: 7, Bytes: 999},
			map[string]string{"hidden": "false", "captured": "7", "total": "not counted yet", "dead": "0", "inFlight": "0", "pending": "0", "bytes": "999 B"}},
		{"no capture", nil, map[string]string{"hidden": "true"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := spanJobUntil(t, 10*time.Minute, 0, time.Now())
			report := func(ctx context.Context) (monitor.Report, error) {
				r, err := monitor.Assess(ctx, st, monitor.AssessOptions{Job: "cap", Now: time.Now(), DeadAfter: 30 * time.Second})
				r.Capture = c.capture
				return r, err
			}
			p, _ := openDashboard(t, bctx, st, report)
			run(p, "first status", chromedp.Poll[bool](`!!document.body.dataset.statusAt`, chromedp.WithPollingInterval(100*time.Millisecond)))
			got := run(p, "capture section", chromedp.Evaluate[map[string]string](`(() => {
				const t = (id) => document.getElementById(id).textContent;
				const hidden = String(document.getElementById("capture").hidden || document.getElementById("capture").offsetParent === null);
				if (hidden === "true") return { hidden };
				return { hidden, captured: t("capture-captured"), total: t("capture-total"), dead: t("capture-dead"),
					inFlight: t("capture-in_flight"), pending: t("capture-pending"), bytes: t("capture-bytes") };
			})()`))
			p.screenshot("dashboard-capture-" + c.name)
			if len(got) != len(c.want) {
				t.Fatalf("capture section = %v, want %v", got, c.want)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("capture section %s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}
