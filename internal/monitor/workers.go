package monitor

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// WorkerStatus is one worker (a `regen run` process) of a job, from its
// latest heartbeat.
type WorkerStatus struct {
	Owner        string           `json:"owner"`
	Host         string           `json:"host"`
	PID          int              `json:"pid"`
	State        State            `json:"state"`
	Evidence     []string         `json:"evidence"`
	Started      time.Time        `json:"started"`
	HeartbeatAt  time.Time        `json:"heartbeat_at"`
	HeartbeatAge time.Duration    `json:"heartbeat_age_ns"`
	Live         bool             `json:"live"` // fresh heartbeat (or process seen on this host), not exited
	ExitReason   string           `json:"exit_reason"`
	Lanes        []string         `json:"lanes"` // [] = every lane
	InFlight     int              `json:"in_flight"`
	Tokens       int64            `json:"tokens"`
	Done         int64            `json:"done"`            // samples this worker finished since it started
	Rate         float64          `json:"samples_per_sec"` // over its last minute
	Endpoints    []EndpointStatus `json:"endpoints"`
}

// StoreDown is the report when the store itself cannot be reached: the job
// is DOWN with the store as the subject, whatever its workers are doing.
func StoreDown(job string, now time.Time, cause error) Report {
	return Report{
		SchemaVersion: SchemaVersion,
		Job:           job,
		Time:          now,
		State:         Down,
		Evidence:      []string{"store unreachable: " + cause.Error()},
		ExitCode:      ExitCode(Down),
		ETANote:       "none while DOWN: nothing is progressing",
		Store:         &StoreStatus{State: Down, Cause: cause.Error()},
	}
}

// StoreStatus is the store's own condition when it is not simply up.
type StoreStatus struct {
	State State  `json:"state"`
	Cause string `json:"cause"`
}

// MarshalJSON writes a worker in the status schema: null for unknown
// times, its heartbeat's age in seconds too, [] for empty lists.
func (w WorkerStatus) MarshalJSON() ([]byte, error) {
	type plain WorkerStatus
	p := plain(w)
	emptySlices(&p)
	return json.Marshal(struct {
		plain
		Started             *time.Time `json:"started"`
		HeartbeatAt         *time.Time `json:"heartbeat_at"`
		HeartbeatAgeSeconds float64    `json:"heartbeat_age_seconds"`
	}{p, nullTime(w.Started), nullTime(w.HeartbeatAt), w.HeartbeatAge.Seconds()})
}

// workers turns heartbeats into worker states, newest first.
func workers(hbs []store.Heartbeat, o AssessOptions) ([]WorkerStatus, error) {
	out := make([]WorkerStatus, 0, len(hbs))
	for _, hb := range hbs {
		var b Beat
		if len(hb.Counters) > 0 {
			if err := json.Unmarshal(hb.Counters, &b); err != nil {
				return nil, fmt.Errorf("decode heartbeat of %s: %w", hb.Owner, err)
			}
		}
		w := WorkerStatus{Owner: hb.Owner, Host: hb.Host, PID: hb.PID, Started: hb.Started, HeartbeatAt: hb.Time,
			HeartbeatAge: o.Now.Sub(hb.Time), ExitReason: b.ExitReason, Lanes: b.Lanes, InFlight: b.InFlight,
			Tokens: b.Tokens, Done: b.Done, Rate: b.Rate, Endpoints: b.Endpoints}
		gone := o.Host != "" && hb.Host == o.Host && !ProcessAlive(hb.PID)
		note, noted := storeNoteOf(hb.Owner, hb.Time, o)
		switch {
		case b.Exited && b.ExitReason == ExitFinished:
			w.State = Done
		case b.Exited && b.State == Failed:
			w.State, w.Evidence = Failed, append([]string{"exited: " + b.ExitReason}, b.Evidence...)
		case b.Exited:
			w.State, w.Evidence = Stopped, []string{"exited: " + b.ExitReason}
		case noted:
			w.Live, w.State, w.Evidence = true, Down, storeDownEvidence(note, w.HeartbeatAge, o.Now)
		case gone || w.HeartbeatAge > o.DeadAfter:
			w.State = Dead
			w.Evidence = []string{fmt.Sprintf("last heartbeat %s ago (deadline %s)", w.HeartbeatAge.Round(time.Second), o.DeadAfter)}
			if gone {
				w.Evidence = append(w.Evidence, fmt.Sprintf("process %d no longer exists", hb.PID))
			}
		default:
			w.Live = true
			w.State, w.Evidence = b.State, b.Evidence
			if w.State == "" {
				w.State = Running
			}
		}
		out = append(out, w)
	}
	return out, nil
}

// hopeful orders live workers' states for the job's state when none is
// RUNNING: the job is as well as its best worker.
var hopeful = []State{Running, Draining, Starting, Restarting, Stalled, Down, Failed}

// jobOfWorkers is the job's state from its live workers: RUNNING if any
// makes progress, else the most hopeful of their states; the evidence names
// every live worker that is not running. ok is false with no live worker.
func jobOfWorkers(ws []WorkerStatus) (State, []string, bool) {
	var live []WorkerStatus
	for _, w := range ws {
		if w.Live {
			live = append(live, w)
		}
	}
	if len(live) == 0 {
		return "", nil, false
	}
	if len(live) == 1 {
		return live[0].State, live[0].Evidence, true
	}
	best := len(hopeful)
	var ev []string
	for _, w := range live {
		rank := len(hopeful)
		for i, s := range hopeful {
			if w.State == s {
				rank = i
			}
		}
		best = min(best, rank)
		if w.State != Running {
			line := fmt.Sprintf("worker %s pid %d: %s", w.Host, w.PID, w.State)
			if len(w.Evidence) > 0 {
				line += " (" + strings.Join(w.Evidence, "; ") + ")"
			}
			ev = append(ev, line)
		}
	}
	state := Running
	if best < len(hopeful) {
		state = hopeful[best]
	}
	if state == Running {
		ev = append([]string{fmt.Sprintf("%d workers live", len(live))}, ev...)
	}
	return state, ev, true
}

// ForHost narrows r to the workers on host: their state decides (the live
// one's, else DONE if one exited after the export, else DEAD), for a
// per-node liveness check of a job that many nodes share.
func ForHost(r Report, host string) Report {
	var mine []WorkerStatus
	for _, w := range r.Workers {
		if w.Host == host {
			mine = append(mine, w)
		}
	}
	r.Workers = mine
	switch s, ev, ok := jobOfWorkers(mine); {
	case ok:
		r.State, r.Evidence = s, ev
	case len(mine) > 0 && mine[0].State == Done:
		r.State, r.Evidence = Done, []string{fmt.Sprintf("the worker on %s finished and exited", host)}
	case len(mine) > 0:
		r.State, r.Evidence = mine[0].State, append([]string{fmt.Sprintf("no live worker on %s; the last one:", host)}, mine[0].Evidence...)
		if r.State == "" {
			r.State = Dead
		}
	default:
		r.State, r.Evidence = Dead, []string{fmt.Sprintf("no worker of this job has run on %s", host)}
	}
	r.ExitCode = ExitCode(r.State)
	return r
}
