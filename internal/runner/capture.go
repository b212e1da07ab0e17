package runner

import (
	"context"

	"github.com/regen-dev/regen/internal/monitor"
)

// captureOnce runs the job's capture (Options.Capture) the first time
// every sample of the job is finished, before the export, so the
// manifest lists its files. Only an interrupt is returned; the capture's
// own failure is kept for end, which fails the run after exporting.
func (r *runState) captureOnce(ctx context.Context) error {
	if r.o.Capture == nil || r.capture.ran {
		return nil
	}
	r.capture.ran = true
	r.setState(ctx, monitor.Running, []string{"all samples finished; capturing hidden states"})
	r.note("capture: hidden states of the done samples")
	r.draw(ctx, "")
	line, err := r.o.Capture(ctx)
	if line != "" {
		r.note(line)
		r.draw(ctx, "")
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.capture.err = err
	return nil
}

// captureAlone is captureOnce for a run that does not export, with the
// heartbeat kept fresh meanwhile.
func (r *runState) captureAlone(ctx context.Context) error {
	stop := r.beatEvery(context.WithoutCancel(ctx), r.o.Spec.Monitor.HeartbeatEvery)
	err := r.captureOnce(ctx)
	stop()
	if err != nil {
		r.beat(context.WithoutCancel(ctx), true, "interrupted")
		return ErrInterrupted
	}
	return nil
}
