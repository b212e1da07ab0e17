package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/regen-dev/regen/internal/crew"
	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
)

// rescueDead has the crew return the leases of workers that are gone
// (crew.RescueDead) and wakes the dispatcher to claim them at once.
func (r *runState) rescueDead(ctx context.Context) error {
	n, err := r.crew.RescueDead(ctx, r.health.HealthyFor(time.Now()))
	if n > 0 && r.disp != nil {
		r.disp.Wake()
	}
	return err
}

// shareEndpoints tells the dispatcher how many live workers send to each
// endpoint (crew.Sharers), for conversation admission's part of each pool.
func (r *runState) shareEndpoints(ctx context.Context) {
	n, err := r.crew.Sharers(ctx, r.fleet.URLs())
	if err != nil {
		r.storeFailed(ctx, err)
		return
	}
	r.disp.SetSharers(n)
}

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
			if err := r.captureOnce(ctx); err != nil {
				return export.Summary{}, false, err
			}
			unlock, ok, err := r.o.Store.TryLock(ctx, crew.ExportLock)
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
	mark, err := r.crew.ExportMark(ctx)
	if err != nil {
		return export.Summary{}, false, err
	}
	if current, err := r.crew.ExportedByOther(ctx, mark); err != nil || current {
		if current {
			r.setExported(mark)
		}
		return export.Summary{}, false, err
	}
	r.setState(ctx, monitor.Running, []string{"all samples finished; exporting"})
	spec := r.o.Spec
	desc, err := export.DescribeJob(spec, r.o.Version)
	if err != nil {
		return export.Summary{}, false, err
	}
	sum, err := export.ExportWith(ctx, r.o.Store, spec.Output.Dir, spec.Output.Formats, spec.BaseName(), export.Options{Metadata: spec.Output.Metadata, Describe: desc, TokenIDs: spec.Output.TokenIDs, TokenRows: spec.Output.TokenRows, TrainTruncated: spec.Output.TrainTruncated,
		KeepHistoryReasoning: spec.Generation.Reasoning == job.ReasoningKeep, EngineOf: spec.EngineOf, JobDir: spec.Dir, Profile: export.ProfileOf(spec), Captured: export.CapturedFor(spec, r.o.Store)})
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
