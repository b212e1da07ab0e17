package fleet

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

// MaxConns is how many connections to keep for reuse per endpoint: every
// fixed lane's concurrency, and for an auto lane its ceiling, or a
// generous pool when it has none.
func MaxConns(spec *job.Spec) int {
	n := 0
	for _, l := range spec.Lanes {
		n += l.Concurrency
		if a := l.Auto; a != nil {
			if a.Max > 0 {
				n += a.Max
			} else {
				n += 512
			}
		}
	}
	return n
}

// observe hands a probe to the dispatcher's adaptive limits and logs what
// they decided.
func (f *Fleet) observe(url string, snap probe.Snapshot) {
	if f.log.Enabled(context.Background(), slog.LevelDebug-4) {
		m := snap.Metrics
		e, _ := f.disp.Endpoint(url)
		f.log.Log(context.Background(), slog.LevelDebug-4, "probe", "endpoint", url, "in_flight", e.InFlight, "running", m.Running, "queued", m.Queued, "kv", m.TokenUsage, "retracted", m.RetractionsTotal, "generated", m.GenerationTokensTotal)
	}
	for _, d := range f.disp.Observe(url, snap.Metrics, snap.Time) {
		if d.Action == limit.Shed {
			f.limitEvent(context.Background(), "load shed", d)
			continue
		}
		// The dispatcher logs the decisions that move a limit itself.
	}
}

// noteCrash tells the dispatcher an endpoint went down; a crash under
// pressure lowers its adaptive ceilings, recorded as events so status and
// the alert history say why the limit fell.
func (f *Fleet) noteCrash(ctx context.Context, st monitor.EndpointStatus) {
	for _, d := range f.disp.NoteCrash(st.URL, st.Cause, st.Since) {
		f.limitEvent(ctx, "crash under pressure", d)
	}
}

// limitEvent logs a limit decision the operator must see (a crash's
// ceiling, a shed) as a warning and records it as an endpoint_limit event.
func (f *Fleet) limitEvent(ctx context.Context, msg string, d dispatch.LimitDecision) {
	f.log.Warn(msg, "endpoint", d.Endpoint, "lane", d.Lane, "from", d.From, "to", d.To, "decision", d.Action, "reason", d.Reason)
	f.event(ctx, store.Event{Kind: "endpoint_limit", Subject: d.Endpoint, Evidence: fmt.Sprintf("lane %s: %s", d.Lane, d.Decision)})
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
	for _, l := range e.Lanes {
		ll := monitor.LaneLimit{Lane: l.Lane, InFlight: l.InFlight, Limit: l.Limit, Auto: l.Auto, Ceiling: l.Ceiling}
		if !l.Auto {
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
	// Dispatch holds the auto lanes to the ceiling a crash set for them
	// together; AutoLimit says so already.
	st.Limit += e.AutoLimit
	if st.LimitReason == "" && len(fixed) > 0 {
		st.LimitReason = "fixed by the job file (" + strings.Join(fixed, ", ") + "; shared by all endpoints)"
	}
	st.Replays = e.Replays
	st.Hold = nil
	if !e.HoldSince.IsZero() {
		st.Hold = &monitor.Hold{Since: e.HoldSince, Until: e.HeldUntil, Reason: e.HoldReason, FixedCap: e.FixedCap}
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
func setCapacities(d Dispatcher, spec *job.Spec, urls []string) {
	if sv := spec.Server; sv != nil && sv.KVTokens > 0 && len(urls) == 1 {
		d.SetCapacity(urls[0], float64(sv.KVTokens), dispatch.CapacityJob)
	}
	for _, e := range spec.Endpoints {
		if e.KVTokens > 0 {
			d.SetCapacity(e.URL, float64(e.KVTokens), dispatch.CapacityJob)
		}
	}
}

// FreshLoad is e's last read of its server's load while it is still
// current (a few probe periods), nil otherwise.
func (f *Fleet) FreshLoad(e dispatch.EndpointStats, now time.Time) *dispatch.ServerLoad {
	return freshLoad(e, now, probeEvery(f.cfg.Spec))
}
