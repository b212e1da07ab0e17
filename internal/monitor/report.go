package monitor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// Beat is the runner's own view, stored as the heartbeat's counters.
type Beat struct {
	State       State            `json:"state"`
	Evidence    []string         `json:"evidence,omitempty"`
	Endpoints   []EndpointStatus `json:"endpoints,omitempty"`
	InFlight    int              `json:"in_flight"`
	Tokens      int64            `json:"tokens"`
	LastTokenAt time.Time        `json:"last_token_at"`
	// Exited is set by the runner's last heartbeat when it ends on purpose
	// (finished, interrupted or failed), so status can tell STOPPED from DEAD.
	Exited     bool   `json:"exited,omitempty"`
	ExitReason string `json:"exit_reason,omitempty"`
	// A worker's own share of a job that several workers run.
	Lanes []string `json:"lanes,omitempty"` // lanes it claims from (all when empty)
	Done  int64    `json:"done,omitempty"`  // samples it finished since it started
	Rate  float64  `json:"rate,omitempty"`  // its samples per second over the last minute
	// Exported identifies the finished samples of the export this worker
	// wrote or found current when it exited finished.
	Exported string `json:"exported,omitempty"`
}

// ExitFinished is the ExitReason of a runner that finished and exported.
const ExitFinished = "finished"

// CellCounts are the sample counts of one partition and lane.
type CellCounts struct {
	Partition string `json:"partition,omitempty"` // "" in a report's total
	Lane      string `json:"lane,omitempty"`
	Total     int    `json:"total"`
	Done      int    `json:"done"`
	Pending   int    `json:"pending"`
	InFlight  int    `json:"in_flight"`
	Rejected  int    `json:"rejected"`
	Dead      int    `json:"dead"`
}

func (c *CellCounts) add(s store.State, n int) {
	c.Total += n
	switch s {
	case store.Done:
		c.Done += n
	case store.Pending:
		c.Pending += n
	case store.Leased:
		c.InFlight += n
	case store.Rejected:
		c.Rejected += n
	case store.Dead:
		c.Dead += n
	}
}

// Cells folds the store's per-state counts into one row per partition and
// lane, sorted, and their total.
func Cells(counts []store.Count) ([]CellCounts, CellCounts) {
	var total CellCounts
	byKey := map[[2]string]*CellCounts{}
	for _, c := range counts {
		k := [2]string{c.Partition, c.Lane}
		if byKey[k] == nil {
			byKey[k] = &CellCounts{Partition: c.Partition, Lane: c.Lane}
		}
		byKey[k].add(c.State, c.N)
		total.add(c.State, c.N)
	}
	cells := make([]CellCounts, 0, len(byKey))
	for _, c := range byKey {
		cells = append(cells, *c)
	}
	sort.Slice(cells, func(i, j int) bool {
		if cells[i].Partition != cells[j].Partition {
			return cells[i].Partition < cells[j].Partition
		}
		return cells[i].Lane < cells[j].Lane
	})
	return cells, total
}

// Rate is finished work (done or rejected samples) over a window.
type Rate struct {
	Window        time.Duration `json:"window_ns"`
	Samples       int           `json:"samples"`
	Tokens        int64         `json:"tokens"` // completion tokens
	SamplesPerSec float64       `json:"samples_per_sec"`
	TokensPerSec  float64       `json:"tokens_per_sec"`
}

func rateOf(window time.Duration, samples int, tokens int64) Rate {
	r := Rate{Window: window, Samples: samples, Tokens: tokens}
	if window > 0 {
		r.SamplesPerSec = float64(samples) / window.Seconds()
		r.TokensPerSec = float64(tokens) / window.Seconds()
	}
	return r
}

// HeartbeatInfo describes the last heartbeat.
type HeartbeatInfo struct {
	PID     int           `json:"pid"`
	Host    string        `json:"host"`
	Time    time.Time     `json:"time"`
	Age     time.Duration `json:"age_ns"`
	Started time.Time     `json:"started"`
}

// Event is a recorded state change or occurrence, newest first in a Report.
type Event struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`    // endpoint_state, job_state, ingest, restart, takeover, alert_failed, ...
	Subject  string    `json:"subject"` // "job" or an endpoint URL
	State    string    `json:"state"`   // the new state of a state change, "" otherwise
	Evidence string    `json:"evidence"`
	Worker   string    `json:"worker"` // owner id of the worker that recorded it, "" if none
}

// Text is the event as one line without its time: kind, subject, the new
// state of a state change, and the evidence ("ingest job: 603 rows ...",
// "endpoint_state http://h:1 DOWN: exit code 137"). Every view prints
// events through it, so an empty part leaves no stray space.
func (e Event) Text() string {
	var parts []string
	for _, p := range []string{e.Kind, e.Subject, e.State} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	t := strings.Join(parts, " ")
	if e.Evidence != "" {
		t += ": " + e.Evidence
	}
	return t
}

// EventOf is the report's form of a stored event.
func EventOf(e store.Event) Event {
	return Event{Time: e.Time, Kind: e.Kind, Subject: e.Subject, State: e.State, Evidence: e.Evidence, Worker: e.Worker}
}

// Report is one screen of truth about a job, built from the store alone.
// Its JSON form is `regen status --json`, documented in docs/status-json.md:
// a field added here must be added there too.
type Report struct {
	SchemaVersion int            `json:"schema_version"` // always SchemaVersion in JSON
	Job           string         `json:"job"`
	Time          time.Time      `json:"time"` // when the report was made
	State         State          `json:"state"`
	Evidence      []string       `json:"evidence"`
	ExitCode      int            `json:"exit_code"`
	Heartbeat     *HeartbeatInfo `json:"heartbeat"` // nil when no runner ever started
	// RunnerExited is set when the last runner ended on purpose (finished,
	// interrupted, failed): the endpoints are then as it last saw them.
	RunnerExited bool `json:"runner_exited"`
	// RunnerDied is set when no runner is live and the last one ended
	// without saying so (killed, crashed, its host lost): its endpoints, and
	// the leased samples counted in flight, are as of its last heartbeat.
	RunnerDied bool         `json:"runner_died"`
	Cells      []CellCounts `json:"cells"`
	Total      CellCounts   `json:"total"`
	Rate1m     Rate         `json:"rate_1m"`
	Rate10m    Rate         `json:"rate_10m"`
	// RatesRun is the run(s) the rates and the charts are over (SpanOf):
	// an earlier run's when the newest did no work; nil with no heartbeat.
	RatesRun *RunSpan `json:"rates_run"`
	// Average is the whole job's rate from its first to its last result,
	// filled once no runner is working on the job (it reads every result).
	Average *Rate `json:"average"`
	// ETA is 0 when there is none; ETANote then says why (done, nothing can
	// progress, no recent throughput).
	ETA          time.Duration    `json:"eta_ns"`
	ETANote      string           `json:"eta_note"`
	Endpoints    []EndpointStatus `json:"endpoints"`
	Events       []Event          `json:"events"`
	LastErrors   []ErrorLine      `json:"last_errors"`
	IngestErrors int              `json:"ingest_errors"`
	// Workers lists every process that ever ran the job, newest heartbeat
	// first; with a shared store several are live at once.
	Workers []WorkerStatus `json:"workers"`
	// Store is set when the store itself is the problem (unreachable).
	Store *StoreStatus `json:"store"`
	// Rejects counts the rejected samples per quality rule, most first.
	Rejects []RuleCount `json:"rejects"`
	// RejectedFile is where export writes the rejected samples, relative
	// to the job file ("" when the caller does not know the job file).
	RejectedFile string `json:"rejected_file"`
	// RejectedExported is how many rejected samples the last export's
	// manifest counts (0 when nothing was exported yet).
	RejectedExported int `json:"rejected_exported"`
	// Generations are the job's configuration generations, oldest first;
	// the last is the one the job runs with (empty before the first run).
	Generations []store.Generation `json:"generations"`
	// Capture is the hidden-state capture's progress (ReadCapture); nil
	// for a job without a capture section.
	Capture *CaptureProgress `json:"capture"`
}

// RuleCount is the number of samples one quality rule rejected.
type RuleCount struct {
	Rule string `json:"rule"`
	N    int    `json:"n"`
}

// ErrorLine is one recent per-sample failure.
type ErrorLine struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Reason string `json:"reason"`
}

// AssessOptions tune Assess.
type AssessOptions struct {
	Job       string // the job's name, copied into the report
	Now       time.Time
	DeadAfter time.Duration // heartbeat older than this = DEAD
	Host      string        // this machine's name, to check whether a same-host runner pid still exists
	// StoreNotes are the runners' notes beside the job (ReadStoreNotes): a
	// live runner that cannot write its store is DOWN, not DEAD.
	StoreNotes []StoreNote
}

// Store is what Assess reads: the headline numbers, the workers' journal
// and the latest errors.
type Store interface {
	store.Progress
	store.JournalReader
	LastErrors(ctx context.Context, limit int) ([]store.Row, error)
}

// Assess builds a Report from the store alone.
func Assess(ctx context.Context, st Store, o AssessOptions) (Report, error) {
	r := Report{SchemaVersion: SchemaVersion, Job: o.Job, Time: o.Now}
	counts, err := st.Counts(ctx)
	if err != nil {
		return r, fmt.Errorf("read counts: %w", err)
	}
	r.Cells, r.Total = Cells(counts)

	hbs, err := st.Heartbeats(ctx)
	if err != nil {
		return r, fmt.Errorf("read heartbeats: %w", err)
	}
	if r.Workers, err = workers(hbs, o); err != nil {
		return r, err
	}
	hb, haveHB, beat, err := r.readHeartbeat(hbs, o.Now)
	if err != nil {
		return r, err
	}
	remaining := r.Total.Pending + r.Total.InFlight
	r.State, r.Evidence = judge(r, hb, haveHB, beat, remaining, o)
	if n, ok := storeNoteOf(hb.Owner, hb.Time, o); ok && haveHB && r.State == Down {
		r.Store = &StoreStatus{State: Down, Cause: n.Cause}
	}
	if haveHB && r.State != Done && len(r.Workers) > 1 {
		if s, ev, ok := jobOfWorkers(r.Workers); ok {
			r.State, r.Evidence = s, ev
		}
	}
	r.ExitCode = ExitCode(r.State)

	if span, ok := SpanOf(hbs); ok {
		r.RatesRun = &span
		if err := r.readRates(ctx, st, span, o.Now); err != nil {
			return r, err
		}
	}
	if !working(r.State) {
		// Summing every result is O(job), so only for a job nobody works on,
		// where the windows above say nothing any more.
		tp, err := st.ThroughputSince(ctx, time.Time{})
		if err != nil {
			return r, fmt.Errorf("read job throughput: %w", err)
		}
		if tp.Samples > 0 {
			avg := rateOf(tp.Last.Sub(tp.First), tp.Samples, tp.CompletionTokens)
			r.Average = &avg
		}
	}
	recent := r.Rate10m
	if r.RatesRun != nil && r.RatesRun.Earlier {
		recent = Rate{Window: r.Rate10m.Window} // no ETA from another run's pace
	}
	r.ETA, r.ETANote = eta(r.State, remaining, recent)

	if err := r.readRecords(ctx, st); err != nil {
		return r, err
	}
	return r, nil
}

// readHeartbeat fills the runner's side of r from the newest heartbeat
// (hbs[0]) and the workers' list: the endpoints, with their load's age at
// now, and whether the runner exited or died.
func (r *Report) readHeartbeat(hbs []store.Heartbeat, now time.Time) (hb store.Heartbeat, haveHB bool, beat Beat, err error) {
	haveHB = len(hbs) > 0
	if haveHB {
		hb = hbs[0] // the newest
		r.Heartbeat = &HeartbeatInfo{PID: hb.PID, Host: hb.Host, Time: hb.Time, Age: now.Sub(hb.Time), Started: hb.Started}
		if len(hb.Counters) > 0 {
			if err := json.Unmarshal(hb.Counters, &beat); err != nil {
				return hb, haveHB, beat, fmt.Errorf("decode heartbeat: %w", err)
			}
		}
		r.Endpoints = beat.Endpoints
		r.RunnerExited = beat.Exited
		// Every live worker's endpoints: a live worker's view is current,
		// a newer dead one's is not.
		if live, n := liveEndpoints(r.Workers); n > 0 {
			r.Endpoints = live
		}
		r.RunnerDied = !beat.Exited && !anyLive(r.Workers)
	}
	for i := range r.Endpoints {
		if l := r.Endpoints[i].Load; l != nil && !l.At.IsZero() {
			aged := *l // the heartbeat's copy is shared with the workers' list
			aged.Age = now.Sub(l.At)
			r.Endpoints[i].Load = &aged
		}
	}
	return hb, haveHB, beat, nil
}

// readRecords fills the lists r shows from the store: the last events and
// errors, the counts of bad rows and rejects, the generations.
func (r *Report) readRecords(ctx context.Context, st Store) error {
	var err error
	events, err := st.Events(ctx, 5)
	if err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	for _, e := range events {
		r.Events = append(r.Events, EventOf(e))
	}
	rows, err := st.LastErrors(ctx, 5)
	if err != nil {
		return fmt.Errorf("read errors: %w", err)
	}
	for _, row := range rows {
		r.LastErrors = append(r.LastErrors, ErrorLine{ID: row.ID, State: string(row.State), Reason: row.Reason})
	}
	// Counted, never listed: a wrong field mapping makes every source row bad.
	if r.IngestErrors, err = st.IngestErrorCount(ctx); err != nil {
		return fmt.Errorf("count ingest errors: %w", err)
	}
	if r.Rejects, err = rejectsByRule(ctx, st); err != nil {
		return err
	}
	if r.Generations, err = st.Generations(ctx); err != nil {
		return fmt.Errorf("read generations: %w", err)
	}
	return nil
}

// readRates fills the one- and ten-minute rates over span. With no live
// runner, or over an earlier run, the windows end at its last heartbeat:
// the rate it had, not one that decays for ten minutes after its end.
func (r *Report) readRates(ctx context.Context, st Store, span RunSpan, now time.Time) error {
	end := now
	if (span.Earlier || r.RunnerDied || r.RunnerExited) && span.Ended.Before(end) {
		end = span.Ended
	}
	var err error
	// "Now" is folded from the history rows as a chart bucket is (one
	// definition everywhere); the ten-minute rate from the answers.
	if r.Rate1m, err = readNowRate(ctx, st, end, span); err != nil {
		return err
	}
	window := 10 * time.Minute
	if !span.Started.IsZero() && end.Sub(span.Started) < window && end.Sub(span.Started) > 0 {
		window = end.Sub(span.Started) // a young run would otherwise look slow
	}
	tp, err := st.ThroughputSince(ctx, end.Add(-window))
	if err != nil {
		return fmt.Errorf("read throughput: %w", err)
	}
	r.Rate10m = rateOf(window, tp.Samples, tp.CompletionTokens)
	return nil
}

// rejectsByRule folds the store's per-cell reject counts into one count
// per rule, most first.
func rejectsByRule(ctx context.Context, st Store) ([]RuleCount, error) {
	rc, err := st.RejectCounts(ctx)
	if err != nil {
		return nil, fmt.Errorf("count rejects: %w", err)
	}
	byRule := map[string]int{}
	for _, c := range rc {
		byRule[c.Rule] += c.N
	}
	out := make([]RuleCount, 0, len(byRule))
	for rule, n := range byRule {
		out = append(out, RuleCount{Rule: rule, N: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].Rule < out[j].Rule
	})
	return out, nil
}

// working reports whether a runner is on the job (it may be held up).
func working(s State) bool {
	switch s {
	case Done, Dead, Stopped, Failed:
		return false
	}
	return true
}

// eta is the time left at the recent rate, only while work progresses: a
// job that is down, stalled or stopped has no ETA, only a reason.
func eta(s State, remaining int, recent Rate) (time.Duration, string) {
	switch {
	case s == Done:
		return 0, "done"
	case s == Draining:
		return 0, "none while DRAINING: the runner stops once its requests in flight are answered"
	case s != Running:
		return 0, fmt.Sprintf("none while %s: nothing is progressing", s)
	case remaining == 0:
		return 0, "all samples finished; exporting"
	case recent.SamplesPerSec <= 0:
		return 0, fmt.Sprintf("unknown: no sample finished in the last %s", recent.Window.Round(time.Second))
	}
	return time.Duration(float64(remaining) / recent.SamplesPerSec * float64(time.Second)), ""
}

func judge(r Report, hb store.Heartbeat, haveHB bool, beat Beat, remaining int, o AssessOptions) (State, []string) {
	finished := fmt.Sprintf("all %d samples finished (%d done, %d rejected, %d dead)",
		r.Total.Total, r.Total.Done, r.Total.Rejected, r.Total.Dead)
	// DONE means the output exists too: only a worker that exited after the
	// export says so, and none has beaten since (r.Workers is newest first).
	// Finished samples with a dead runner are still an alarm.
	if r.Total.Total > 0 && remaining == 0 && len(r.Workers) > 0 && r.Workers[0].State == Done {
		return Done, []string{finished}
	}
	if !haveHB {
		return Dead, []string{"no runner has ever written a heartbeat for this job"}
	}
	age := o.Now.Sub(hb.Time).Round(time.Second)
	if beat.Exited {
		if beat.State == Failed {
			return Failed, append([]string{"runner exited: " + beat.ExitReason}, beat.Evidence...)
		}
		return Stopped, []string{fmt.Sprintf("runner pid %d exited %s ago: %s; %d samples remaining; re-run to resume",
			hb.PID, age, beat.ExitReason, remaining)}
	}
	// A runner that cannot write its store says so beside the job.
	if n, ok := storeNoteOf(hb.Owner, hb.Time, o); ok {
		return Down, storeDownEvidence(n, o.Now.Sub(hb.Time), o.Now)
	}
	// On the runner's own host a vanished process is proof enough: no need to
	// wait out the heartbeat deadline to call it dead.
	gone := o.Host != "" && hb.Host == o.Host && !ProcessAlive(hb.PID)
	if gone || o.Now.Sub(hb.Time) > o.DeadAfter {
		ev := []string{fmt.Sprintf("last heartbeat %s ago (deadline %s) from pid %d on %s", age, o.DeadAfter, hb.PID, hb.Host)}
		if gone {
			ev = append(ev, fmt.Sprintf("process %d no longer exists", hb.PID))
		}
		if remaining == 0 && r.Total.Total > 0 {
			ev = append(ev, finished+", but the runner died before exporting; re-run to export")
		} else {
			ev = append(ev, fmt.Sprintf("%d samples remaining; re-run to resume", remaining))
		}
		return Dead, ev
	}
	if beat.State == "" {
		return Running, nil
	}
	return beat.State, beat.Evidence
}

// liveEndpoints concatenates the endpoints of every live worker, and
// counts those workers.
func liveEndpoints(ws []WorkerStatus) (out []EndpointStatus, n int) {
	for _, w := range ws {
		if w.Live {
			n++
			out = append(out, w.Endpoints...)
		}
	}
	return out, n
}

// anyLive reports whether some worker of the job is live.
func anyLive(ws []WorkerStatus) bool {
	for _, w := range ws {
		if w.Live {
			return true
		}
	}
	return false
}

// ProcessAlive reports whether a process with pid exists on this machine.
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	err = p.Signal(syscall.Signal(0))
	return err == nil || err == syscall.EPERM
}
