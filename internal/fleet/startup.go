package fleet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/probe"
)

// A run must not sit on a typo. Two judgements end it early with a
// RefusedError, both pure functions of what the fleet saw:
//   - every endpoint refuses the job's configuration (a model it does not
//     serve, a key it rejects): nothing can progress, so the run stops at
//     once, naming the job file's line to fix;
//   - no endpoint regen does not launch has answered anything (a request, a
//     health probe) since the run started, for monitor.start_deadline: a
//     wrong URL or port. A launched server has its own start-up deadline
//     (server.ready_timeout), so it is not judged here.

// startGuardEvery is how often the judgements are made.
const startGuardEvery = 250 * time.Millisecond

// startState is what the start-up judgements read, per URL.
type startState struct {
	mu       sync.Mutex
	started  time.Time
	answered map[string]bool
	lastErr  map[string]string
}

func newStartState(now time.Time) *startState {
	return &startState{started: now, answered: map[string]bool{}, lastErr: map[string]string{}}
}

// probed records a health probe of url: any HTTP status is an answer.
func (s *startState) probed(url string, snap probe.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap.HealthStatus != 0 {
		s.answered[url] = true
		return
	}
	if snap.HealthErr != nil {
		s.lastErr[url] = snap.HealthErr.Error()
	}
}

// neverAnswered returns the URLs of urls that never answered, and whether
// none did.
func (s *startState) neverAnswered(urls []string) (silent []string, none bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range urls {
		if !s.answered[u] {
			silent = append(silent, u)
		}
	}
	return silent, len(silent) == len(urls)
}

// where is the job file and line of the field at path ("job.yaml:4"),
// for messages that say what to fix.
func (f *Fleet) where(path string) string {
	spec := f.cfg.Spec
	name := filepath.Base(spec.Path)
	if fe := spec.FieldErrorf(path, ""); fe.Line > 0 {
		return fmt.Sprintf("%s:%d", name, fe.Line)
	}
	return name
}

// endpointPath is the job file's field of url's endpoint ("endpoints[1]"),
// "server" for a launched one.
func (f *Fleet) endpointPath(url string) string {
	for i, e := range f.cfg.Spec.Endpoints {
		if e.URL == url {
			return fmt.Sprintf("endpoints[%d]", i)
		}
	}
	return "server"
}

// neverAnsweredCause is what an endpoint that never answered says.
func (f *Fleet) neverAnsweredCause(url string) string {
	p := f.endpointPath(url) + ".url"
	return fmt.Sprintf("never answered since the run started: is the url right? (%s at %s)", p, f.where(p))
}

// silentCause is neverAnsweredCause for an endpoint that never answered,
// "" once it did.
func (f *Fleet) silentCause(url string) string {
	if _, none := f.start.neverAnswered([]string{url}); none {
		return f.neverAnsweredCause(url)
	}
	return ""
}

// startVerdict returns the error that ends the run now, or nil.
func (f *Fleet) startVerdict(now time.Time) error {
	urls := f.URLs()
	f.mu.Lock()
	var refused []string
	for _, u := range urls {
		if r := f.refusals[u]; r != "" {
			refused = append(refused, u+": "+r)
		}
	}
	f.mu.Unlock()
	if len(refused) == len(urls) && len(urls) > 0 {
		return &RefusedError{Cause: "every endpoint refuses the job's configuration: " + strings.Join(refused, "; "), Evidence: refused}
	}
	deadline := f.cfg.Spec.Monitor.StartDeadline
	if f.cfg.Spec.Server != nil || deadline <= 0 || now.Sub(f.start.started) < deadline {
		return nil
	}
	silent, none := f.start.neverAnswered(urls)
	if !none {
		return nil
	}
	ev := make([]string, 0, len(silent))
	f.start.mu.Lock()
	for _, u := range silent {
		line := u + ": " + f.neverAnsweredCause(u)
		if e := f.start.lastErr[u]; e != "" {
			line += "; last error: " + e
		}
		ev = append(ev, line)
	}
	f.start.mu.Unlock()
	return &RefusedError{Cause: fmt.Sprintf("no endpoint answered in the %s since the run started (monitor.start_deadline at %s): %s",
		deadline, f.where("monitor.start_deadline"), strings.Join(ev, "; ")), Evidence: ev}
}

// guardStart makes the start-up judgements until ctx ends, and stops the
// run (stop) with the first verdict.
func (f *Fleet) guardStart(ctx context.Context, stop context.CancelCauseFunc) {
	onTicks(ctx, startGuardEvery, func(now time.Time) bool {
		err := f.startVerdict(now)
		if err != nil {
			f.log.Error("fleet stopping the run", "err", err)
			stop(err)
		}
		return err == nil
	})
}

// onTicks calls fn at each tick of a ticker of period every until ctx
// ends or fn returns false.
func onTicks(ctx context.Context, every time.Duration, fn func(now time.Time) bool) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !fn(now) {
				return
			}
		}
	}
}

// Run keeps the endpoints up until ctx ends; it returns a *FailedError
// when no endpoint can be brought back, and a *RefusedError when every
// endpoint refuses the job's configuration or none answered by
// monitor.start_deadline.
func (f *Fleet) Run(ctx context.Context) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	wg.Go(func() { f.guardStart(ctx, stop) })
	if f.cfg.Spec.Output.TokenIDs { // the render check is for token ids only
		wg.Go(func() { f.reprobeRenders(ctx) })
	}
	err := f.keeper.Run(ctx)
	stop(nil)
	wg.Wait()
	var refused *RefusedError
	if errors.As(context.Cause(ctx), &refused) {
		return refused
	}
	return err
}

// RefusedError is returned by Run when the run cannot go on as configured:
// every endpoint refuses the job's configuration, or none answered by
// monitor.start_deadline. Unlike a FailedError nothing failed: the job
// file is to be fixed (Cause names its line) and the run started again.
type RefusedError struct {
	Cause    string
	Evidence []string
}

func (e *RefusedError) Error() string { return e.Cause }
