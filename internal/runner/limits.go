package runner

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/dispatch/limit"
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
	if r.o.Logger.Enabled(context.Background(), slog.LevelDebug-4) {
		m := snap.Metrics
		var infl int
		for _, e := range r.disp.Snapshot().Endpoints {
			if e.URL == url {
				infl = e.InFlight
			}
		}
		r.o.Logger.Log(context.Background(), slog.LevelDebug-4, "probe", "endpoint", url, "in_flight", infl, "running", m.Running, "queued", m.Queued, "kv", m.TokenUsage, "retracted", m.RetractionsTotal, "generated", m.GenerationTokensTotal)
	}
	for _, d := range r.disp.Observe(url, snap.Metrics, snap.Time) {
		if d.Action == limit.Shed {
			r.limitEvent(context.Background(), "load shed", d)
			continue
		}
		// The dispatcher logs the decisions that move a limit itself.
	}
}

// noteCrash tells the dispatcher an endpoint went down; a crash under
// pressure lowers its adaptive ceilings, recorded as events so status and
// the alert history say why the limit fell.
func (r *runState) noteCrash(ctx context.Context, st monitor.EndpointStatus) {
	for _, d := range r.disp.NoteCrash(st.URL, st.Cause, st.Since) {
		r.limitEvent(ctx, "crash under pressure", d)
	}
}

// limitEvent logs a limit decision the operator must see (a crash's
// ceiling, a shed) as a warning and records it as an endpoint_limit event.
func (r *runState) limitEvent(ctx context.Context, msg string, d dispatch.LimitDecision) {
	r.o.Logger.Warn(msg, "endpoint", d.Endpoint, "lane", d.Lane, "from", d.From, "to", d.To, "decision", d.Action, "reason", d.Reason)
	r.event(ctx, store.Event{Kind: "endpoint_limit", Subject: d.Endpoint, Evidence: fmt.Sprintf("lane %s: %s", d.Lane, d.Decision)})
}

// A server's load stays current for loadFreshFor probe intervals, and at
// least loadFreshMin: a server that stopped answering (down, restarting)
// shows no load rather than its last one as if it were now.
const (
	loadFreshFor = 3
	loadFreshMin = 10 * time.Second
)

// freshLoad is e's last read of its server's load, nil when there is none
// still current at now.
func freshLoad(e dispatch.EndpointStats, now time.Time, every time.Duration) *dispatch.ServerLoad {
	if e.Load == nil || now.Sub(e.Load.At) > max(loadFreshFor*every, loadFreshMin) {
		return nil
	}
	return e.Load
}

// limitsOf copies the dispatcher's limits, KV pool and load of one endpoint
// into its status; the load only while fresh.
func limitsOf(e dispatch.EndpointStats, st *monitor.EndpointStatus, now time.Time, every time.Duration) {
	st.Limit, st.LimitReason, st.Lanes = 0, "", nil
	var moved time.Time
	var fixed []string
	// After a crash under pressure the auto lanes share one ceiling: their
	// sum is held to it, whatever each lane's own limit says.
	autoSum, ceiling := 0, 0
	for _, l := range e.Lanes {
		ll := monitor.LaneLimit{Lane: l.Lane, InFlight: l.InFlight, Limit: l.Limit, Auto: l.Auto, Ceiling: l.Ceiling}
		if l.Auto {
			autoSum += l.Limit
			ceiling = max(ceiling, l.Ceiling)
		} else {
			st.Limit += l.Limit
		}
		if l.Moved != nil {
			ll.Reason = l.Moved.String()
			if !l.Moved.Time.Before(moved) {
				moved, st.LimitReason = l.Moved.Time, l.Lane+": "+ll.Reason
			}
		} else {
			ll.Reason = "fixed by the job file"
			fixed = append(fixed, fmt.Sprintf("%s %d", l.Lane, l.Limit))
		}
		st.Lanes = append(st.Lanes, ll)
	}
	if ceiling > 0 {
		autoSum = min(autoSum, ceiling)
	}
	st.Limit += autoSum
	if st.LimitReason == "" && len(fixed) > 0 {
		st.LimitReason = "fixed by the job file (" + strings.Join(fixed, ", ") + "; shared by all endpoints)"
	}
	st.KVTokens, st.KVTokensSource = int64(e.KVTokens), e.KVTokensSource
	st.Load = nil
	if ld := freshLoad(e, now, every); ld != nil {
		known := func(v float64) *float64 {
			if v < 0 {
				return nil
			}
			return &v
		}
		st.Load = &monitor.Load{At: ld.At, Every: every, Running: known(ld.Running), Queued: known(ld.Queued), KVUsage: known(ld.KVUsage), RetractionsTotal: known(ld.RetractionsTotal)}
	}
}

// setCapacities gives the dispatcher the KV pools the job file names
// (server.kv_tokens for the launched server, endpoints[].kv_tokens), for
// balancing until each server reports its own.
func setCapacities(d *dispatch.Dispatcher, spec *job.Spec, urls []string) {
	if sv := spec.Server; sv != nil && sv.KVTokens > 0 && len(urls) == 1 {
		d.SetCapacity(urls[0], float64(sv.KVTokens), dispatch.CapacityJob)
	}
	for _, e := range spec.Endpoints {
		if e.KVTokens > 0 {
			d.SetCapacity(e.URL, float64(e.KVTokens), dispatch.CapacityJob)
		}
	}
}
