package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store"
)

// A store that is not shared (SQLite) has one runner at a time: a second
// one refuses to start beside a live one. A shared store (PostgreSQL) has
// any number of workers at once; each returns the leases of workers it
// finds dead, and at the end exactly one of them exports while the others
// wait for that export and finish too.

// takeOver prepares this worker's start: on a single-runner store it
// refuses to run beside a live runner and releases a dead one's leases; on
// a shared store it releases the leases of every dead worker.
func (r *runState) takeOver(ctx context.Context) error {
	if r.id.shared {
		if err := r.rescueDead(ctx, true); err != nil {
			return err
		}
	} else {
		if err := r.own(ctx); err != nil {
			return err
		}
		hb, ok, err := r.o.Store.LastHeartbeat(ctx)
		if err != nil {
			return fmt.Errorf("read heartbeat: %w", err)
		}
		if ok {
			if err := r.takeOverFrom(ctx, hb); err != nil {
				return err
			}
		}
	}
	if _, err := r.o.Store.ExpireLeases(ctx, time.Now()); err != nil {
		return fmt.Errorf("expire leases: %w", err)
	}
	return nil
}

// runnerLock is the lock a single-runner store's runner holds for its
// life: checking that no runner is live and becoming the runner are one
// step, which reading the last heartbeat and deciding is not (two runners
// started together both read the dead runner's heartbeat and both ran).
const runnerLock = "runner"

// own takes the runner lock, or says who holds it. The kernel drops the
// lock when its holder dies, however it dies.
func (r *runState) own(ctx context.Context) error {
	if r.workers.disown != nil {
		return nil // taken on an earlier try
	}
	unlock, ok, err := r.o.Store.TryLock(ctx, runnerLock)
	if err != nil {
		return fmt.Errorf("take job %s: %w", r.o.Spec.Name, err)
	}
	if ok {
		r.workers.disown = unlock
		return nil
	}
	// The holder may not have written its first heartbeat yet.
	if hb, ok, err := r.o.Store.LastHeartbeat(ctx); err == nil && ok && hb.Host == r.id.host && monitor.RegenAlive(hb.PID) {
		return r.runBy(hb)
	}
	return fmt.Errorf("job %s is being run by another regen process (it holds the job's runner lock in %s.locks); stop that process first",
		r.o.Spec.Name, r.o.Spec.Rel(r.o.Store.Info().Location))
}

// release gives up the runner lock once the run is over.
func (r *runState) release() {
	if r.workers.disown == nil {
		return
	}
	if err := r.workers.disown(); err != nil {
		r.o.Logger.Warn("release runner lock", "err", err)
	}
	r.workers.disown = nil
}

// runBy is the refusal to run beside the live runner of heartbeat hb.
func (r *runState) runBy(hb store.Heartbeat) error {
	if hb.Host == r.id.host {
		return fmt.Errorf("job %s is being run by pid %d on this machine (heartbeat %s ago); stop that process first",
			r.o.Spec.Name, hb.PID, time.Since(hb.Time).Round(time.Second))
	}
	return fmt.Errorf("job %s is being run by pid %d on %s (heartbeat %s ago); stop it first or wait until its heartbeat is %s old",
		r.o.Spec.Name, hb.PID, hb.Host, time.Since(hb.Time).Round(time.Second), r.o.Spec.Monitor.DeadAfter)
}

func (r *runState) takeOverFrom(ctx context.Context, hb store.Heartbeat) error {
	var beat monitor.Beat
	_ = json.Unmarshal(hb.Counters, &beat)
	// On this host the runner lock decides: its holder is the live runner,
	// and this runner holds it now (a pid in the heartbeat may have been
	// reused). Elsewhere (a store on a shared disk) only a fresh heartbeat
	// proves life.
	alive := hb.Host != r.id.host && time.Since(hb.Time) < r.o.Spec.Monitor.DeadAfter
	if alive && !beat.Exited && hb.PID != os.Getpid() {
		return r.runBy(hb)
	}
	n, err := r.o.Store.ReleaseOwner(ctx, hb.Owner)
	if err != nil {
		return fmt.Errorf("release leases of previous runner: %w", err)
	}
	if n > 0 {
		r.event(ctx, store.Event{Kind: "takeover", Subject: "job",
			Evidence: fmt.Sprintf("released %d samples leased by previous runner pid %d (no attempts spent)", n, hb.PID)})
	}
	return nil
}

// rescueDead returns the leases of workers that are gone to pending, at
// once rather than when their leases expire. A worker is gone when it
// exited, when it ran on this host and its process is gone, or when its
// heartbeat is older than dead_after, on this host too: a process that is
// frozen (SIGSTOP, a stalled VM) holds samples no one generates, and the
// store's fencing tokens refuse its answers if it wakes. The last rule
// trusts the heartbeat only while this worker has itself been reaching the
// store for at least dead_after: after an outage everyone's heartbeat is
// stale.
func (r *runState) rescueDead(ctx context.Context, starting bool) error {
	now := time.Now()
	deadAfter := r.o.Spec.Monitor.DeadAfter
	trustAge := starting || r.health.HealthyFor(now) >= deadAfter
	hbs, err := r.o.Store.Heartbeats(ctx)
	if err != nil {
		return fmt.Errorf("read heartbeats: %w", err)
	}
	for _, hb := range hbs {
		if hb.Owner == r.id.owner {
			continue
		}
		if t, ok := r.workers.rescued[hb.Owner]; ok && t.Equal(hb.Time) {
			continue // released already, and it has not beaten since
		}
		if !monitor.WorkerGone(hb, r.id.host, now, deadAfter, trustAge) {
			continue
		}
		n, err := r.o.Store.ReleaseOwner(ctx, hb.Owner)
		if err != nil {
			return fmt.Errorf("release leases of worker %s: %w", hb.Owner, err)
		}
		r.workers.rescued[hb.Owner] = hb.Time
		if n > 0 {
			r.event(ctx, store.Event{Kind: "takeover", Subject: "job",
				Evidence: fmt.Sprintf("released %d samples leased by worker pid %d on %s, gone since its heartbeat %s ago (no attempts spent)",
					n, hb.PID, hb.Host, now.Sub(hb.Time).Round(time.Second))})
			if r.disp != nil {
				r.disp.Wake()
			}
		}
	}
	return nil
}

// exportLock is the named lock the exporting worker holds.
const exportLock = "export"

// finishPoll is how often a finished worker looks at the others.
const finishPoll = time.Second

// finish ends a worker whose dispatcher found its lanes finished: it waits
// until every lane of the job is finished (other workers may serve other
// lanes), then exports under the export lock, unless another worker already
// exported the same finished samples while this one ran. A holder that
// dies releases the lock and the next worker exports instead. It returns
// whether this worker wrote the files.
func (r *runState) finish(ctx context.Context) (export.Summary, bool, error) {
	for {
		remaining, err := r.remaining(ctx)
		if err != nil {
			r.storeFailed(ctx, err)
		} else if remaining > 0 {
			r.setState(ctx, monitor.Running, []string{fmt.Sprintf("this worker's lanes are finished; waiting for other workers: %d samples remaining", remaining)})
		} else {
			unlock, ok, err := r.o.Store.TryLock(ctx, exportLock)
			switch {
			case err != nil:
				r.storeFailed(ctx, err)
			case ok:
				sum, wrote, err := r.exportLocked(ctx)
				if uerr := unlock(); uerr != nil {
					r.o.Logger.Warn("release export lock", "err", uerr)
				}
				return sum, wrote, err
			default:
				r.setState(ctx, monitor.Running, []string{"all samples finished; another worker is exporting"})
			}
		}
		select {
		case <-ctx.Done():
			return export.Summary{}, false, ctx.Err()
		case <-time.After(finishPoll):
		}
	}
}

// exportLocked exports, holding the export lock, unless another worker of
// this run already exported the same finished samples.
func (r *runState) exportLocked(ctx context.Context) (export.Summary, bool, error) {
	mark, err := r.exportMark(ctx)
	if err != nil {
		return export.Summary{}, false, err
	}
	if r.id.shared {
		current, err := r.exportedAs(ctx, mark)
		if err != nil {
			return export.Summary{}, false, err
		}
		if current {
			r.setExported(mark)
			return export.Summary{}, false, nil
		}
	}
	r.setState(ctx, monitor.Running, []string{"all samples finished; exporting"})
	spec := r.o.Spec
	desc, err := export.DescribeJob(spec, r.o.Version)
	if err != nil {
		return export.Summary{}, false, err
	}
	sum, err := export.ExportWith(ctx, r.o.Store, spec.Output.Dir, spec.Output.Formats, spec.BaseName(), export.Options{Metadata: spec.Output.Metadata, Describe: desc, TokenIDs: spec.Output.TokenIDs, EngineOf: spec.EngineOf, JobDir: spec.Dir})
	if err != nil {
		return sum, false, err
	}
	for _, w := range sum.Warnings {
		r.o.Logger.Warn("export", "warning", w)
	}
	// Say so before the lock goes: a worker taking it next must see that
	// this export is current.
	r.setExported(mark)
	r.beat(ctx, false, "")
	return sum, true, nil
}

// setExported records the export mark the heartbeat carries from now on.
func (r *runState) setExported(mark string) {
	r.view.mu.Lock()
	r.view.exported = mark
	r.view.mu.Unlock()
}

// exportMark identifies the finished samples an export holds: the same
// counts mean the same export (a requeue changes them).
func (r *runState) exportMark(ctx context.Context) (string, error) {
	counts, err := r.o.Store.Counts(ctx)
	if err != nil {
		return "", fmt.Errorf("read counts: %w", err)
	}
	bad, err := r.o.Store.IngestErrorCount(ctx)
	if err != nil {
		return "", fmt.Errorf("count ingest errors: %w", err)
	}
	_, t := monitor.Cells(counts)
	return fmt.Sprintf("%d done, %d rejected, %d dead, %d bad rows", t.Done, t.Rejected, t.Dead, bad), nil
}

// exportedAs reports whether another worker wrote (or found) an export of
// mark while this one was running. An export by an earlier run does not
// count: a re-run writes the files again, in case they were moved away.
func (r *runState) exportedAs(ctx context.Context, mark string) (bool, error) {
	hbs, err := r.o.Store.Heartbeats(ctx)
	if err != nil {
		return false, fmt.Errorf("read heartbeats: %w", err)
	}
	for _, hb := range hbs {
		var b monitor.Beat
		if hb.Owner != r.id.owner && !hb.Time.Before(r.id.started) && json.Unmarshal(hb.Counters, &b) == nil && b.Exported == mark {
			return true, nil
		}
	}
	return false, nil
}
