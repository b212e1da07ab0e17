package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// onState is the keeper's report of a transition: record it, alert, and
// pause or resume dispatch to the endpoint.
func (f *Fleet) onState(ctx context.Context, prev, cur monitor.EndpointStatus) {
	ev := append([]string{cur.Cause}, cur.Evidence...)
	f.event(ctx, store.Event{Kind: "endpoint_state", Subject: cur.URL, State: string(cur.State), Evidence: JoinEvidence(ev)})
	f.alert(ctx, monitor.Transition{Job: f.cfg.Spec.Name, Subject: cur.URL, From: prev.State, To: cur.State, Time: time.Now(), Evidence: ev})
	if f.disp != nil {
		switch cur.State {
		case monitor.Ready, monitor.Degraded:
			f.serveIfModel(ctx, prev, cur)
		default:
			reason := string(cur.State)
			if cur.Cause != "" {
				reason += ": " + cur.Cause
			}
			f.disp.Pause(cur.URL, reason)
			if cur.State == monitor.Down && prev.State != monitor.Down {
				f.noteCrash(ctx, cur)
			}
		}
	}
	f.changed()
}

// serveIfModel resumes an endpoint that became ready, unless it does not
// serve the job's model: readiness includes serving it, where the engine
// would otherwise refuse every request.
func (f *Fleet) serveIfModel(ctx context.Context, prev, cur monitor.EndpointStatus) {
	if prev.State != monitor.Ready && prev.State != monitor.Degraded {
		refusal := f.checkModel(ctx, cur.URL)
		f.mu.Lock()
		if refusal == "" {
			delete(f.refusals, cur.URL)
		} else {
			f.refusals[cur.URL] = refusal
		}
		f.mu.Unlock()
	}
	f.mu.Lock()
	refusal := f.refusals[cur.URL]
	f.mu.Unlock()
	if refusal == "" {
		f.disp.Resume(cur.URL)
	} else {
		f.disp.Pause(cur.URL, "model not served")
	}
}

// Statuses is each endpoint as its keeper sees it, with the dispatcher's
// counters, limits and breaker verdict and the model check's, and Since
// the time of its last transition. A verdict the keeper did not report
// itself is recorded and alerted here, once it has lasted breakerSettle.
func (f *Fleet) Statuses(ctx context.Context, now time.Time) []monitor.EndpointStatus {
	eps := f.keeper.Statuses()
	for i, raw := range eps {
		if e, ok := f.disp.Endpoint(raw.URL); ok {
			eps[i].InFlight = e.InFlight
			eps[i].LastTokenAt = e.LastTokenAt
			eps[i].Tokens = e.TokensTotal
			limitsOf(e, &eps[i], now, probeEvery(f.cfg.Spec))
			// Healthy by its probe but refusing our requests (wrong model name,
			// bad key, dying engine): the breaker is the truth, with its reason.
			// Half-open is no better until its probe request succeeds: a
			// killed server must not read READY while that request hangs.
			switch {
			case !e.BrokenSince.IsZero() && serving(raw.State):
				eps[i].State = monitor.Down
				eps[i].Cause = "broken: " + e.LastServerDown
				eps[i].Evidence = []string{fmt.Sprintf("%d samples in a row failed with this error and nothing succeeded; paused, probed with one request at a time (since %s)",
					e.BrokenSamples, e.BrokenSince.Format(time.TimeOnly))}
			case e.Breaker != "closed" && serving(raw.State):
				eps[i].State = monitor.Down
				eps[i].Cause = "requests fail: " + e.LastServerDown
				eps[i].Evidence = nil
			}
		}
		f.mu.Lock()
		refusal, warning := f.refusals[raw.URL], f.warnings[raw.URL]
		f.mu.Unlock()
		if refusal != "" && serving(raw.State) {
			eps[i].State, eps[i].Cause, eps[i].Evidence = monitor.Down, "model not served", []string{refusal}
		}
		if warning != "" {
			eps[i].Evidence = append(slices.Clone(eps[i].Evidence), warning)
		}
		eps[i] = f.settle(ctx, raw, eps[i], now)
	}
	return eps
}

// serving reports whether an endpoint in state s takes requests.
func serving(s monitor.State) bool { return s == monitor.Ready || s == monitor.Degraded }

// breakerSettle is how long the breaker's verdict must differ from the
// keeper's before it is shown: a crashing server fails its requests a
// moment before its supervisor reports it, and that is one transition, not
// two.
const breakerSettle = time.Second

// settle gives cur (the keeper's raw status, maybe overruled by the
// breaker or the model check) the time of its last transition. A
// transition the keeper did not report itself is recorded (kind
// "breaker"), alerted and shown at once here, once it has lasted
// breakerSettle; its Since is when it began.
func (f *Fleet) settle(ctx context.Context, raw, cur monitor.EndpointStatus, now time.Time) monitor.EndpointStatus {
	f.mu.Lock()
	prev, seen := f.shown[cur.URL]
	same := seen && prev.State == cur.State && prev.Cause == cur.Cause
	keeperReported := cur.State == raw.State && cur.Cause == raw.Cause && raw.Since.After(prev.Since)
	record := false
	switch {
	case same:
		cur.Since = prev.Since
		delete(f.overruled, cur.URL)
	case keeperReported || !seen:
		// The keeper's own transition, with its time, recorded by onState.
		delete(f.overruled, cur.URL)
	default:
		// The verdict's clock runs from when its state began: a killed
		// server's requests fail first mid-stream, then at connect, and
		// that new wording is the same outage, not a new one to wait out.
		began, pending := f.overruled[cur.URL]
		if !pending || began.State != cur.State {
			began = monitor.EndpointStatus{State: cur.State, Cause: cur.Cause, Since: now}
			f.overruled[cur.URL] = began
		}
		if now.Sub(began.Since) < breakerSettle {
			// Not yet: keep showing the previous state.
			f.mu.Unlock()
			prev.InFlight, prev.LastTokenAt, prev.Tokens, prev.Load = cur.InFlight, cur.LastTokenAt, cur.Tokens, cur.Load
			return prev
		}
		delete(f.overruled, cur.URL)
		cur.Since = began.Since
		record = true
	}
	shown := cur
	shown.Evidence = slices.Clone(cur.Evidence)
	f.shown[cur.URL] = shown
	f.mu.Unlock()
	if record {
		ev := append([]string{cur.Cause}, cur.Evidence...)
		f.event(ctx, store.Event{Time: cur.Since, Kind: "breaker", Subject: cur.URL, State: string(cur.State), Evidence: JoinEvidence(ev)})
		f.alert(ctx, monitor.Transition{Job: f.cfg.Spec.Name, Subject: cur.URL, From: prev.State, To: cur.State, Time: cur.Since, Evidence: ev})
		f.changed()
	}
	return cur
}
