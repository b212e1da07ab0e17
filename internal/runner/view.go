package runner

import (
	"context"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// note has the view print line at once, above its next frame.
func (r *runState) note(line string) {
	r.view.mu.Lock()
	r.view.notes = append(r.view.notes, line)
	r.view.mu.Unlock()
	notify(r.sig.redraw)
}

// notify signals ch without blocking; one pending signal is enough.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// progressLoop publishes a frame every ProgressEvery and at once when a
// state changes, and a final frame when ctx ends.
func (r *runState) progressLoop(ctx context.Context) {
	t := time.NewTicker(r.o.ProgressEvery)
	defer t.Stop()
	shown := r.draw(ctx, "")
	for {
		select {
		case <-ctx.Done():
			r.draw(ctx, "") // the final frame
			return
		case <-t.C:
			shown = r.draw(ctx, "")
		case <-r.sig.redraw:
			shown = r.draw(ctx, shown)
		}
	}
}

// draw publishes one frame to Options.Progress unless its states are those
// of the frame published last (skip, "" never matches) and it carries no
// note; it returns the states published.
// It works before and after the endpoints and the dispatcher exist (a
// finished job has neither).
func (r *runState) draw(ctx context.Context, skip string) string {
	// The last frame is drawn after ctx ends, so it must not depend on it.
	ctx = context.WithoutCancel(ctx)
	f := monitor.Frame{Job: r.o.Spec.Name}
	if r.disp != nil && r.fleet != nil {
		l, cells := r.live(ctx)
		// The run's own tok/s is over the tokens the charts count.
		f.Time, f.Cells, f.Tokens, f.InFlight, f.Endpoints = l.Now, cells, r.disp.Totals().Streamed, l.InFlight, l.Endpoints
		for _, ls := range r.disp.LaneStats() {
			f.Lanes = append(f.Lanes, monitor.LaneTiming{Name: ls.Name, MeanDuration: ls.MeanDuration, Tail: ls.Tail,
				EscalateTo: ls.EscalateTo, Answered: ls.Answered, Escalated: ls.Escalated, InFlight: ls.InFlight, Kept: ls.Kept})
		}
	} else {
		counts, err := r.o.Store.Counts(ctx)
		if err != nil {
			return skip
		}
		f.Time = time.Now()
		f.Cells, _ = monitor.Cells(counts)
	}
	r.view.mu.Lock()
	f.State, f.Evidence = r.view.state, r.view.evidence
	f.Notes = r.view.notes
	r.view.notes = nil
	r.view.mu.Unlock()
	if len(f.Notes) > 0 {
		skip = "" // a note moves the view: the frame is drawn again below it
	}
	states := string(f.State)
	for _, e := range f.Endpoints {
		states += " " + string(e.State) + ":" + e.Cause
	}
	if states == skip {
		return skip
	}
	if r.o.Progress != nil {
		r.o.Progress(f)
	}
	return states
}
