package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// beatEvery writes heartbeats until the returned stop is called.
func (r *runState) beatEvery(ctx context.Context, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// stop ends the loop, never a write in progress: a statement
		// cancelled on the client may still commit on a PostgreSQL server,
		// after the final heartbeat, and make a finished worker look dead.
		write := context.WithoutCancel(ctx)
		tickUntil(ctx, every, func() { r.beat(write, false, "") })
	}()
	return func() { cancel(); <-done }
}

// tickUntil calls fn now and then every period until ctx ends.
func tickUntil(ctx context.Context, every time.Duration, fn func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func newOwner(host string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// live gathers the runner's current evidence. When the store does not
// answer it uses the last counts read and says the store is down.
func (r *runState) live(ctx context.Context) (monitor.Live, []monitor.CellCounts) {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		r.storeFailed(ctx, err)
		counts, _ = r.health.Last()
	} else {
		r.health.Keep(counts)
	}
	out, total := monitor.Cells(counts)
	now := time.Now()
	l := monitor.Live{Now: now, StartedAt: r.id.started, Remaining: total.Pending + total.InFlight, StallAfter: r.o.Spec.Monitor.StallAfter,
		Endpoints: r.fleet.Statuses(ctx, now)}
	l.StoreDown, l.StoreDownSince = r.health.State()
	if ds := r.disp.StoreState(); ds.Down && (l.StoreDown == "" || ds.Since.Before(l.StoreDownSince)) {
		l.StoreDown, l.StoreDownSince = ds.LastError, ds.Since
	}
	tot := r.disp.Totals()
	l.InFlight, l.LastTokenAt = tot.InFlight, tot.LastTokenAt
	return l, out
}

func (r *runState) tokens() int64 { return r.disp.Totals().Tokens }

// watchEvery is how often the heartbeat loop looks at the endpoints (in
// memory) for a transition to write and show at once.
const watchEvery = 250 * time.Millisecond

// heartbeatLoop writes the heartbeat every heartbeat_every, and at once
// when a state changes, so `regen status` and the view learn of a server
// that went down within a fraction of a second, not at the next tick.
func (r *runState) heartbeatLoop(ctx context.Context) {
	// Ending the loop must not cancel a heartbeat being written (see
	// beatEvery): the final one comes after it.
	write := context.WithoutCancel(ctx)
	step := func() {
		l, _ := r.live(ctx)
		s, ev := monitor.Evaluate(l)
		if r.drain.on.Load() {
			if s == monitor.Running {
				s, ev = monitor.Draining, nil
			}
			ev = append(ev, r.drainEvidence(l.InFlight))
		}
		if s != monitor.Done { // DONE is declared once the dispatcher has really finished
			r.setState(ctx, s, ev)
		}
		r.noteStoreDown(l.Now)
		// A store that is down is tried again with backoff, not every step.
		if r.health.Due(l.Now) {
			r.writeBeat(write, false, "", &l)
			r.recordHistory(ctx, l.Now)
		}
		if r.id.shared && l.StoreDown == "" {
			if err := r.rescueDead(ctx); err != nil {
				r.storeFailed(ctx, err)
			}
			r.shareEndpoints(ctx)
		}
	}
	beat := time.NewTicker(r.o.Spec.Monitor.HeartbeatEvery)
	defer beat.Stop()
	watch := time.NewTicker(watchEvery)
	defer watch.Stop()
	step()
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			step()
		case <-r.sig.changed:
			step()
			notify(r.sig.redraw)
		case <-watch.C:
			r.fleet.Statuses(ctx, time.Now())
		}
	}
}

// beat writes the heartbeat with the runner's current view.
func (r *runState) beat(ctx context.Context, exited bool, reason string) {
	var l *monitor.Live
	if r.disp != nil && r.fleet != nil {
		live, _ := r.live(ctx)
		l = &live
	}
	r.writeBeat(ctx, exited, reason, l)
	if l != nil {
		r.recordHistory(ctx, l.Now)
	}
}

// writeBeat writes the heartbeat with live evidence already gathered (nil: none).
func (r *runState) writeBeat(ctx context.Context, exited bool, reason string, l *monitor.Live) {
	r.beats.mu.Lock()
	defer r.beats.mu.Unlock()
	if r.beats.final {
		return // aborted: the last heartbeat is written
	}
	r.view.mu.Lock()
	b := monitor.Beat{State: r.view.state, Evidence: r.view.evidence, Exited: exited, ExitReason: reason, Lanes: r.o.Lanes, Exported: r.view.exported}
	r.view.mu.Unlock()
	if l != nil {
		b.Endpoints, b.InFlight, b.LastTokenAt = l.Endpoints, l.InFlight, l.LastTokenAt
		b.Tokens = r.tokens()
	}
	if r.disp != nil {
		b.Done = r.disp.Counters().Done
		b.Rate = r.beats.rate.Add(time.Now(), b.Done)
	}
	counters, _ := json.Marshal(b)
	hb := store.Heartbeat{Owner: r.id.owner, PID: os.Getpid(), Host: r.id.host, Time: time.Now(), Started: r.id.started, Counters: counters}
	if err := r.o.Store.PutHeartbeat(ctx, hb); err != nil {
		r.storeFailed(ctx, err)
		return
	}
	r.storeWrote(ctx)
}
