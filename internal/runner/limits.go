package runner

import (
	"context"
	"fmt"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/probe"
	"github.com/regen-dev/regen/internal/store"
)

// autoConns is how many connections to keep for reuse per endpoint for an
// auto lane: its ceiling, or a generous pool when it has none.
func autoConns(a job.Auto) int {
	if a.Max > 0 {
		return a.Max
	}
	return 512
}

// observe hands a probe to the dispatcher's adaptive limits and logs what
// they decided.
func (r *runState) observe(url string, snap probe.Snapshot) {
	for _, d := range r.disp.Observe(url, snap.Metrics, snap.Time) {
		if d.To != d.From {
			r.o.Logger.Debug("limit", "endpoint", d.Endpoint, "lane", d.Lane, "from", d.From, "to", d.To, "action", d.Action, "reason", d.Reason)
		}
	}
}

// noteCrash tells the dispatcher an endpoint went down; a crash under
// pressure lowers its adaptive ceilings, recorded as events so status and
// the alert history say why the limit fell.
func (r *runState) noteCrash(ctx context.Context, st monitor.EndpointStatus) {
	for _, d := range r.disp.NoteCrash(st.URL, st.Cause, st.Since) {
		r.o.Logger.Warn("limit ceiling", "endpoint", d.Endpoint, "lane", d.Lane, "from", d.From, "to", d.To, "reason", d.Reason)
		r.event(ctx, store.Event{Kind: "endpoint_limit", Subject: st.URL, Evidence: fmt.Sprintf("lane %s: %s", d.Lane, d.Decision)})
	}
}
