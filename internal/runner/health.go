package runner

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// untilStore runs fn and, on a shared store, runs it again with backoff
// for as long as it fails, as the dispatcher does with its writes: a
// database restarting under a starting worker is an outage to wait out, not
// a reason to exit. On an embedded store fn's error is returned at once.
func (r *runState) untilStore(ctx context.Context, fn func(context.Context) error) error {
	gap := 200 * time.Millisecond
	for {
		err := fn(ctx)
		if err == nil || !r.id.shared || ctx.Err() != nil {
			return err
		}
		r.storeFailed(ctx, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gap):
		}
		gap = min(2*gap, 5*time.Second)
	}
}

// noteStoreDown writes, while this runner cannot write its store, a note
// beside the job that `regen status` reads without the store: a live
// runner whose heartbeat is old is then DOWN with the store as the cause,
// not DEAD. It is rewritten at every heartbeat, so a fresh one proves life.
func (r *runState) noteStoreDown(now time.Time) {
	cause, since := r.health.State()
	if cause == "" {
		return
	}
	n := monitor.StoreNote{Owner: r.id.owner, PID: os.Getpid(), Host: r.id.host, Time: now, Since: since, Cause: cause}
	if err := monitor.WriteStoreNote(r.o.Spec.StateDir(), n); err != nil && !r.health.NoteFailed() {
		r.o.Logger.Warn("store down note", "err", err)
	}
}

// forgetStoreNote removes this runner's note once the store takes writes
// again, and at exit.
func (r *runState) forgetStoreNote() {
	if err := monitor.RemoveStoreNote(r.o.Spec.StateDir(), os.Getpid()); err != nil {
		r.o.Logger.Warn("store down note", "err", err)
	}
}

func (r *runState) event(ctx context.Context, e store.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Worker = r.id.owner
	if err := r.o.Store.AddEvent(ctx, e); err != nil {
		r.storeFailed(ctx, err)
		return
	}
	r.storeWrote(ctx)
}

// storeFailed notes that the store did not answer this runner. The start
// of an outage is logged, then a reminder at growing intervals (see
// monitor.StoreHealth).
func (r *runState) storeFailed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // our own shutdown, not the store's
	}
	l := r.health.Failed(err, time.Now())
	args := []any{"store", r.o.Store.Info().Location, "err", err}
	if l.Unlogged > 0 {
		args = append(args, "outages_not_logged", l.Unlogged)
	}
	switch l.Kind {
	case monitor.LogStarted:
		r.o.Logger.Warn("store down; retrying", args...)
		notify(r.sig.changed)
	case monitor.LogStillDown:
		_, since := r.health.State()
		args = append(args, "down_for", time.Since(since).Round(time.Second), "failed_calls", l.Failures)
		r.o.Logger.Warn("store still down; retrying", args...)
	}
}

// storeWrote notes that a write reached the store: only a write ends an
// outage (a full disk still answers reads). The end is recorded as an
// event, now that events can be written again.
func (r *runState) storeWrote(ctx context.Context) {
	end := r.health.Wrote(time.Now())
	if !end.Ended {
		return
	}
	r.forgetStoreNote()
	if end.Logged {
		r.o.Logger.Warn("store back", "down_for", end.DownFor.Round(time.Millisecond))
	}
	r.event(ctx, store.Event{Kind: "store_state", Subject: "store", State: "UP",
		Evidence: fmt.Sprintf("back after %s down: %s", end.DownFor.Round(time.Second), end.Cause)})
	notify(r.sig.changed)
}
