package monitor

import (
	"context"
	"errors"
	"fmt"
)

// ErrAlertDropped is the failure of a transition the full queue dropped.
var ErrAlertDropped = errors.New("dropped")

// AlertQueue runs an Alerter's hooks one transition at a time, in order,
// apart from whoever reports the transitions: a slow hook never holds up a
// supervisor's callback or a heartbeat.
type AlertQueue struct {
	alerter *Alerter
	// failed hears a transition whose hook failed or that was dropped
	// (ErrAlertDropped), so the run records it.
	failed func(ctx context.Context, t Transition, err error)
	ch     chan Transition
	done   chan struct{}
}

// AlertQueueSize bounds the transitions waiting for a slow hook.
const AlertQueueSize = 256

// StartAlerts starts the queue for a (nil: no hooks); failed may be nil.
// Stop must be called once.
func StartAlerts(ctx context.Context, a *Alerter, failed func(ctx context.Context, t Transition, err error)) *AlertQueue {
	if failed == nil {
		failed = func(context.Context, Transition, error) {}
	}
	q := &AlertQueue{alerter: a, failed: failed, ch: make(chan Transition, AlertQueueSize), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for t := range q.ch {
			if err := q.alerter.Notify(ctx, t); err != nil {
				q.failed(ctx, t, err)
			}
		}
	}()
	return q
}

// Send queues t when a hook wants it; it never blocks: with the queue
// full, t is dropped and reported as failed.
func (q *AlertQueue) Send(ctx context.Context, t Transition) {
	if !q.alerter.Wants(t) {
		return
	}
	select {
	case q.ch <- t:
	default:
		q.failed(ctx, t, fmt.Errorf("%w: %d alerts already waiting for the hook", ErrAlertDropped, AlertQueueSize))
	}
}

// Stop delivers the queued transitions (each hook is bounded by the
// alerter's timeout), so a FAILED alert goes out before the run returns.
func (q *AlertQueue) Stop() {
	close(q.ch)
	<-q.done
}
