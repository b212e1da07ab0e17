package supervise

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/probe"
)

// pollReady closes inc.readyCh once the readiness endpoint answers 200.
func (s *Supervisor) pollReady(ctx context.Context, inc *incarnation) {
	url := s.url + s.cfg.Dialect.ReadyPath
	t := time.NewTicker(s.cfg.ReadyPollEvery)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		code, err := probe.Health(rctx, s.cfg.Client, url)
		cancel()
		if err == nil && code == http.StatusOK {
			close(inc.readyCh)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probeLoop sends one snapshot per ProbeEvery until ctx ends.
func (s *Supervisor) probeLoop(ctx context.Context, inc *incarnation) {
	for {
		snap := probe.Probe(ctx, s.cfg.Client, s.url, s.cfg.Dialect)
		select {
		case <-ctx.Done():
			return
		case inc.probes <- snap:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.ProbeEvery):
		}
	}
}

// watch holds the per-incarnation judgement state.
type watch struct {
	state      State
	readyAt    time.Time
	startedAt  time.Time
	watched    map[int]string // child pid -> comm, watched for exit
	firstSeen  map[int]time.Time
	probeFails int
	lastProbe  string
	lastGen    float64
	lastGenAt  time.Time
	haveGen    bool
	metrics    engine.Metrics
	metricsAt  time.Time
}

func (s *Supervisor) watchLoop(ctx, ictx context.Context, inc *incarnation, wg *sync.WaitGroup) outcome {
	now := s.cfg.Now()
	w := &watch{state: Starting, startedAt: now, watched: map[int]string{}, firstSeen: map[int]time.Time{}}
	tick := time.NewTicker(s.cfg.PollEvery)
	defer tick.Stop()
	readyCh := inc.readyCh

	becomeReady := func(how string) {
		now := s.cfg.Now()
		w.readyAt, w.lastGenAt = now, now
		ms, _ := groupMembers(inc.pid)
		for pid, m := range ms {
			inc.seenPIDs[pid] = true
			if pid != inc.pid && m.alive() {
				w.watched[pid] = m.Comm
			}
		}
		w.state = Ready
		s.setState(Ready, "", []string{how, fmt.Sprintf("ready after %.1fs", now.Sub(w.startedAt).Seconds()), fmt.Sprintf("watching %d child processes", len(w.watched))}, inc.pid)
		s.log.Info("server_ready", "pid", inc.pid, "how", how, "children", len(w.watched))
		wg.Go(func() { s.probeLoop(ictx, inc) })
	}

	for {
		select {
		case <-ctx.Done():
			s.log.Info("server_stop", "pid", inc.pid)
			if err := killGroup(inc.pid, s.cfg.KillGrace, s.cfg.PollEvery); err != nil {
				s.log.Error("server_stop", "err", err)
			}
			s.drain(inc)
			return outcome{stopped: true}

		case ex := <-inc.exited:
			inc.exited <- ex // keep it for cleanup
			return s.fail(inc, w, Down, CauseExit, []string{describeExit(ex)}, true)

		case <-inc.watch.notify:
			if w.state == Starting && inc.watch.isReady() {
				becomeReady("ready line logged")
			}

		case <-readyCh:
			readyCh = nil
			if w.state == Starting {
				becomeReady("GET " + s.cfg.Dialect.ReadyPath + " 200")
			}

		case snap := <-inc.probes:
			if s.cfg.OnProbe != nil {
				s.cfg.OnProbe(snap)
			}
			// A probe refused by a server that just died says nothing new:
			// let the exit, which carries the evidence, win the race.
			if !snap.Healthy() && !processAlive(inc.pid) {
				select {
				case ex := <-inc.exited:
					inc.exited <- ex
					return s.fail(inc, w, Down, CauseExit, []string{describeExit(ex)}, true)
				case <-time.After(time.Second):
				}
			}
			if out, failed := s.judgeProbe(inc, w, snap); failed {
				return out
			}

		case <-tick.C:
			if out, failed := s.judgeTick(inc, w); failed {
				return out
			}
		}
	}
}

func (s *Supervisor) judgeTick(inc *incarnation, w *watch) (outcome, bool) {
	now := s.cfg.Now()
	// A fatal line while the process lives: give the engine FatalGrace to
	// tear itself down (SGLang dumps in-flight requests first), then act.
	if cause, lines, first := inc.watch.rootCause(); cause != "" && now.Sub(first) >= s.cfg.FatalGrace {
		ev := append([]string{fmt.Sprintf("fatal log line, process still alive %.1fs later", now.Sub(first).Seconds())}, lines...)
		return s.fail(inc, w, Down, cause, ev, false), true
	}
	if w.state == Starting {
		if now.Sub(w.startedAt) >= s.server.ReadyTimeout {
			return s.fail(inc, w, Down, CauseReadyTimeout, []string{fmt.Sprintf("not ready after %v (GET %s)", s.server.ReadyTimeout, s.cfg.Dialect.ReadyPath)}, false), true
		}
		if ms, err := groupMembers(inc.pid); err == nil {
			for pid := range ms {
				inc.seenPIDs[pid] = true
			}
		}
		return outcome{}, false
	}

	if out, failed := s.judgeMembers(inc, w, now); failed {
		return out, true
	}
	if out, failed := s.judgeProgress(inc, w, now); failed {
		return out, true
	}
	s.judgeDegraded(inc, w)
	return outcome{}, false
}

// judgeMembers watches the process group: any watched child gone while
// the leader lives is a crash; a child that stays ChildMinAge is watched.
func (s *Supervisor) judgeMembers(inc *incarnation, w *watch, now time.Time) (outcome, bool) {
	ms, err := groupMembers(inc.pid)
	if err != nil {
		return outcome{}, false
	}
	for pid, comm := range w.watched {
		if m, ok := ms[pid]; !ok || !m.alive() {
			return s.fail(inc, w, Down, CauseChildExit, []string{fmt.Sprintf("child pid %d (%s) exited while leader pid %d runs", pid, comm, inc.pid)}, false), true
		}
	}
	for pid, m := range ms {
		inc.seenPIDs[pid] = true
		if pid == inc.pid || !m.alive() {
			continue
		}
		if _, ok := w.watched[pid]; ok {
			continue
		}
		first, ok := w.firstSeen[pid]
		if !ok {
			w.firstSeen[pid] = now
		} else if now.Sub(first) >= s.cfg.ChildMinAge {
			w.watched[pid] = m.Comm
			delete(w.firstSeen, pid)
		}
	}
	for pid := range w.firstSeen {
		if _, ok := ms[pid]; !ok {
			delete(w.firstSeen, pid) // short-lived helper, not a server process
		}
	}
	return outcome{}, false
}

// judgeProgress is the hang and stall rules: requests in flight with no
// token for HangTimeout, or work waiting with no sign of generation from
// any source for StallTimeout.
func (s *Supervisor) judgeProgress(inc *incarnation, w *watch, now time.Time) (outcome, bool) {
	// Hang: the dispatcher has requests out but hears nothing.
	inFlight, lastToken := 0, time.Time{}
	if s.cfg.Progress != nil {
		inFlight, lastToken = s.cfg.Progress()
		ref := lastToken
		if ref.Before(w.readyAt) {
			ref = w.readyAt
		}
		if inFlight > 0 && now.Sub(ref) >= s.cfg.HangTimeout {
			ev := []string{fmt.Sprintf("no token for %.1fs with %d requests in flight", now.Sub(ref).Seconds(), inFlight)}
			return s.fail(inc, w, Stalled, CauseHang, ev, false), true
		}
		if lastToken.After(w.lastGenAt) {
			w.lastGenAt = lastToken
		}
	}

	// Stall: work queued but no sign of generation from any source.
	if g := inc.watch.generationAt(); g.After(w.lastGenAt) {
		w.lastGenAt = g
	}
	// Work waiting: the dispatcher's in-flight count when it is wired, else
	// the waiting queue. Running alone is not trusted: SGLang's gauges keep
	// their last value on an idle server.
	waiting := inFlight > 0
	if s.cfg.Progress == nil {
		waiting = w.metrics.Present.Has(engine.FieldQueued) && w.metrics.Queued > 0
	}
	if !waiting {
		w.lastGenAt = now
	} else if now.Sub(w.lastGenAt) >= s.cfg.StallTimeout {
		ev := []string{fmt.Sprintf("no generation for %.1fs with %d in flight, %.0f running, %.0f queued", now.Sub(w.lastGenAt).Seconds(), inFlight, w.metrics.Running, w.metrics.Queued)}
		return s.fail(inc, w, Stalled, CauseNoGeneration, ev, false), true
	}

	return outcome{}, false
}

func (s *Supervisor) judgeProbe(inc *incarnation, w *watch, snap probe.Snapshot) (outcome, bool) {
	if snap.MetricsErr == nil {
		w.metrics, w.metricsAt = snap.Metrics, snap.Time
		s.mu.Lock()
		s.status.Metrics, s.status.MetricsAt = snap.Metrics, snap.Time
		s.mu.Unlock()
		if snap.Metrics.Present.Has(engine.FieldGenerationTokensTotal) {
			if !w.haveGen || snap.Metrics.GenerationTokensTotal != w.lastGen {
				if w.haveGen {
					w.lastGenAt = snap.Time
				}
				w.lastGen, w.haveGen = snap.Metrics.GenerationTokensTotal, true
			}
		}
	}
	if snap.Healthy() {
		w.probeFails = 0
	} else {
		w.probeFails++
		if snap.HealthErr != nil {
			w.lastProbe = fmt.Sprintf("GET %s: %v", s.cfg.Dialect.HealthPath, snap.HealthErr)
		} else {
			w.lastProbe = fmt.Sprintf("GET %s: status %d after %v", s.cfg.Dialect.HealthPath, snap.HealthStatus, snap.HealthLatency.Round(time.Millisecond))
		}
		if w.probeFails >= s.cfg.ProbeFailures {
			ev := []string{fmt.Sprintf("%d health probes failed in a row", w.probeFails), w.lastProbe}
			return s.fail(inc, w, Stalled, CauseHealth, ev, false), true
		}
	}
	s.judgeDegraded(inc, w)
	return outcome{}, false
}

// judgeDegraded moves between READY and DEGRADED.
func (s *Supervisor) judgeDegraded(inc *incarnation, w *watch) {
	if w.state != Ready && w.state != Degraded {
		return
	}
	now := s.cfg.Now()
	cause, ev := "", []string(nil)
	if w.probeFails > 0 {
		cause, ev = CauseHealthProbe, []string{fmt.Sprintf("%d health probe(s) failed", w.probeFails), w.lastProbe}
	} else if n := inc.watch.retractionsSince(now.Add(-time.Minute)); n >= s.cfg.RetractsPerMinute {
		cause, ev = CauseRetractions, []string{fmt.Sprintf("%d KV retractions in the last minute", n)}
	}
	switch {
	case cause != "" && w.state == Ready:
		w.state = Degraded
		s.setState(Degraded, cause, ev, inc.pid)
	case cause == "" && w.state == Degraded:
		w.state = Ready
		s.setState(Ready, "", []string{"recovered"}, inc.pid)
	}
}

// fail reports DOWN or STALLED, kills the group, waits for the log to drain
// and for GPU memory to be released, and returns the outcome with the most
// specific cause known by then.
func (s *Supervisor) fail(inc *incarnation, w *watch, state State, cause string, evidence []string, leaderExited bool) outcome {
	if leaderExited {
		// The last lines (the traceback naming the cause) may still be in
		// the pipe; give the reader until it ends (at once, normally) or a
		// bound, for a child that keeps the pipe open. 100 ms missed the
		// traceback on a loaded 2-core CI machine.
		select {
		case <-inc.logDone:
		case <-time.After(exitLogWait):
		}
	}
	// A stopped process cannot act on SIGTERM until continued, and one
	// that hung is not worth the grace: STALLED and stopped is killed now.
	grace := s.cfg.KillGrace
	if stopped := stoppedMembers(inc.pid); state == Stalled && len(stopped) > 0 {
		grace = 0
		evidence = append(evidence, fmt.Sprintf("process %v stopped (state T): killed at once (SIGKILL) without the %s SIGTERM grace", stopped, s.cfg.KillGrace))
	}
	cause, evidence = s.explain(inc, w, state, cause, evidence)
	w.state = state
	s.setState(state, cause, evidence, inc.pid)
	s.log.Warn("server_"+strings.ToLower(string(state)), "cause", cause, "pid", inc.pid, "evidence", evidence)

	if err := killGroup(inc.pid, grace, s.cfg.PollEvery); err != nil {
		s.log.Error("server_kill", "err", err)
		evidence = append(evidence, err.Error())
	}
	s.drain(inc)
	if s.smi != "" {
		if held, err := waitGPURelease(context.Background(), s.smi, inc.seenPIDs, s.cfg.GPUReleaseTimeout, s.cfg.gpuPoll); err != nil {
			s.log.Warn("gpu_release", "err", err, "pids", held)
			evidence = append(evidence, err.Error())
		}
	}
	// Lines read after the report may name the root cause better.
	cause, evidence = s.explain(inc, w, state, cause, evidence)
	s.mu.Lock()
	s.status.Cause, s.status.Evidence, s.status.PID = cause, slices.Clone(evidence), 0
	s.mu.Unlock()
	return outcome{cause: cause, evidence: evidence}
}

// explain upgrades the cause of a DOWN to the log's root cause and adds
// the matching log lines (or the log tail when none matched) and the last
// metrics as evidence. Evidence already present is not repeated.
func (s *Supervisor) explain(inc *incarnation, w *watch, state State, cause string, evidence []string) (string, []string) {
	logCause, lines, _ := inc.watch.rootCause()
	if state == Down && engine.CausePriority(logCause) > engine.CausePriority(cause) {
		cause = logCause
	}
	add := func(e string) {
		if !slices.Contains(evidence, e) {
			evidence = append(evidence, e)
		}
	}
	if len(lines) > 0 {
		for _, l := range lines {
			add("log: " + l)
		}
	} else if state == Down {
		for _, l := range inc.watch.lastLines(5) {
			add("log tail: " + l)
		}
	}
	if !w.readyAt.IsZero() {
		add(fmt.Sprintf("up %.1fs", s.cfg.Now().Sub(w.readyAt).Seconds()))
	}
	if s.cfg.Progress != nil {
		inFlight, last := s.cfg.Progress()
		if !last.IsZero() {
			add(fmt.Sprintf("last token %.1fs ago, %d in flight", s.cfg.Now().Sub(last).Seconds(), inFlight))
		}
	}
	if !w.metricsAt.IsZero() {
		m := w.metrics
		add(fmt.Sprintf("last metrics %.1fs ago: %s", s.cfg.Now().Sub(w.metricsAt).Seconds(), m.Evidence()))
	}
	return cause, evidence
}
