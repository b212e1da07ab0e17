package runner

import (
	"context"
	"fmt"
	"time"
)

// startDrain is the first interrupt: the job drains (DRAINING, with what
// it waits for) and the view prints a line that stays above it.
func (r *runState) startDrain() {
	r.drain.since.Store(time.Now().UnixNano())
	r.drain.on.Store(true)
	inFlight := 0
	if r.disp != nil {
		inFlight = r.disp.Totals().InFlight
	}
	r.note(fmt.Sprintf("regen: interrupted: draining %d in-flight requests (drain timeout %s, until %s); press Ctrl-C again to exit now",
		inFlight, r.o.DrainTimeout, time.Unix(0, r.drain.since.Load()).Add(r.o.DrainTimeout).Format("15:04:05")))
	notify(r.sig.changed)
}

// drainEvidence says what a draining runner waits for.
func (r *runState) drainEvidence(inFlight int) string {
	since := time.Unix(0, r.drain.since.Load())
	return fmt.Sprintf("interrupted at %s: waiting for %d requests in flight, up to the drain timeout %s (until %s); then the rest go back to pending and the runner stops",
		since.Format("15:04:05"), inFlight, r.o.DrainTimeout, since.Add(r.o.DrainTimeout).Format("15:04:05"))
}

// onAbort serves an abort request (see Options.Abort) until the returned
// stop is called.
func (r *runState) onAbort(abort <-chan chan struct{}) (stop func()) {
	if abort == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		select {
		case ack := <-abort:
			r.abort()
			close(ack)
		case <-done:
		}
	}()
	return func() { close(done) }
}

// abortBudget bounds the abort's store writes: the user asked to exit now.
const abortBudget = 3 * time.Second

// abort is the second interrupt: release this runner's leases (no attempt
// spent) and write the last heartbeat, exited, so status says STOPPED and
// the samples are pending, not held by a runner that is gone.
func (r *runState) abort() {
	ctx, cancel := context.WithTimeout(context.Background(), abortBudget)
	defer cancel()
	n, err := r.o.Store.ReleaseOwner(ctx, r.id.owner)
	if err != nil {
		r.o.Logger.Warn("abort: release leases", "err", err)
	}
	reason := fmt.Sprintf("aborted by a second interrupt: %d requests in flight abandoned, their samples back to pending (no attempt spent)", n)
	r.beat(ctx, true, reason)
	r.beats.mu.Lock()
	r.beats.final = true
	r.beats.mu.Unlock()
}
