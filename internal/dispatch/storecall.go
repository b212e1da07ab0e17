package dispatch

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// storeDo runs op until it succeeds or reports ErrNotLeased or
// ErrWrongTurn (final, returned at once). Any other error is retried with backoff for as long as it
// lasts, and the store is reported down meanwhile (Snapshot().Store): a
// result waits here, in memory, instead of being lost or stopping the run.
// It gives up only when stop is closed or the drain is aborted, returning
// the last error.
func (d *Dispatcher) storeDo(ctx context.Context, stop <-chan struct{}, op func(context.Context) error) error {
	gap := storeRetryGap
	failing := false
	for {
		err := op(ctx)
		if err == nil || errors.Is(err, store.ErrNotLeased) || errors.Is(err, store.ErrWrongTurn) {
			if failing {
				d.storeRecovered(true)
			}
			return err
		}
		d.storeFailed(err, !failing)
		failing = true
		t := time.NewTimer(gap/2 + rand.N(gap/2+1)) // jitter: workers do not retry in step
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			d.storeRecovered(false)
			return err
		case <-d.aborted:
			t.Stop()
			d.storeRecovered(false)
			return err
		}
		gap = min(2*gap, maxStoreRetryGap)
	}
}

// storeFailed records a failed store call; first marks the first failure of
// a call. The store is down while any call keeps failing; the first
// failure of an outage is logged.
func (d *Dispatcher) storeFailed(err error, first bool) {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &d.storeSt
	st.Failures++
	st.LastError = err.Error()
	d.unsure++
	if first {
		d.storeRetrying++
	}
	if !st.Down {
		st.Down, st.Since = true, now
		st.Outages++
		d.log.Warn("store down; retrying with backoff, results kept in memory", "err", err)
	}
}

// storeRecovered ends one call's failures; the outage ends with the last.
// Only a call that succeeded (ok) says the store is back: one that gave up
// (a drain that ended) does not know.
func (d *Dispatcher) storeRecovered(ok bool) {
	d.mu.Lock()
	d.storeRetrying--
	st := &d.storeSt
	if d.storeRetrying > 0 || !st.Down {
		d.mu.Unlock()
		return
	}
	down := d.now().Sub(st.Since)
	st.Down, st.Since = false, time.Time{}
	st.LastOutage = down
	d.mu.Unlock()
	if ok {
		d.log.Warn("store back", "down_for", down.Round(time.Millisecond))
	}
	select {
	case d.storeBack <- struct{}{}:
	default:
	}
}

// maintain extends this owner's leases every Lease/3 and returns expired
// leases of dead owners to pending.
func (d *Dispatcher) maintain(ctx, storeCtx context.Context) {
	t := time.NewTicker(max(d.cfg.Lease/3, time.Millisecond))
	defer t.Stop()
	d.expire(storeCtx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.storeBack:
		}
		if err := d.cfg.Store.ExtendLeases(storeCtx, d.cfg.Owner, d.cfg.Lease); err != nil {
			d.log.Warn("extend leases", "err", err)
		}
		d.expire(storeCtx)
	}
}

func (d *Dispatcher) expire(storeCtx context.Context) {
	n, err := d.cfg.Store.ExpireLeases(storeCtx, d.now())
	if err != nil {
		d.log.Warn("expire leases", "err", err)
		return
	}
	if n == 0 {
		return
	}
	d.log.Info("expired leases returned to pending", "samples", n)
	d.mu.Lock()
	for _, l := range d.lanes {
		l.short = false
	}
	d.mu.Unlock()
	d.signal()
}
