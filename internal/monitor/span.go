package monitor

import (
	"encoding/json"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// RunSpan is the stretch of the job's history its rates and charts
// describe: the newest run (with the workers beating beside it), or, when
// that run did no work (a re-run of a finished job redoes nothing; a run
// still waiting for its server), the newest run that did, so a view shows
// the job's last real figures labelled as an earlier run's, never a rate
// of nothing over a third of a second.
type RunSpan struct {
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"` // the last heartbeat of its runs
	PIDs    []int     `json:"pids"`
	// Earlier is set when the span is an earlier run's; IdlePID is then the
	// newest run, which did nothing.
	Earlier bool `json:"earlier"`
	IdlePID int  `json:"idle_pid,omitempty"`
	// Owners are the runs' lease owners: the history rows they wrote.
	Owners []string `json:"-"`
}

// MarshalJSON writes the span with null for times not known.
func (s RunSpan) MarshalJSON() ([]byte, error) {
	type plain RunSpan
	p := plain(s)
	emptySlices(&p)
	return json.Marshal(struct {
		Started *time.Time `json:"started"`
		Ended   *time.Time `json:"ended"`
		plain
	}{nullTime(s.Started), nullTime(s.Ended), p})
}

// owns reports whether a history row written by worker belongs to s.
func (s RunSpan) owns(worker string) bool {
	for _, o := range s.Owners {
		if o == worker {
			return true
		}
	}
	return false
}

// SpanOf chooses the span from the workers' latest heartbeats, newest
// first (store.JournalReader.Heartbeats); ok is false without any. A run
// worked when its heartbeat counted a streamed token or a finished sample.
func SpanOf(hbs []store.Heartbeat) (span RunSpan, ok bool) {
	if len(hbs) == 0 {
		return RunSpan{}, false
	}
	worked := make([]bool, len(hbs))
	for i, h := range hbs {
		var b Beat
		if len(h.Counters) > 0 && json.Unmarshal(h.Counters, &b) == nil {
			worked[i] = b.Tokens > 0 || b.Done > 0
		}
	}
	// The newest run's group: every worker beating when it started.
	newest := hbs[0]
	var group []int
	busy := false
	for i, h := range hbs {
		if !h.Time.Before(newest.Started) {
			group = append(group, i)
			busy = busy || worked[i]
		}
	}
	if !busy {
		for i := range hbs {
			if worked[i] {
				return spanOver(hbs, worked, i, newest.PID), true
			}
		}
	}
	return spanOf(hbs, group), true
}

// spanOver is the span of the working run hbs[anchor] and the working
// runs that overlapped it, an earlier one than the idle run idlePID.
func spanOver(hbs []store.Heartbeat, worked []bool, anchor, idlePID int) RunSpan {
	a := hbs[anchor]
	var group []int
	for i, h := range hbs {
		if worked[i] && !h.Time.Before(a.Started) && !h.Started.After(a.Time) {
			group = append(group, i)
		}
	}
	s := spanOf(hbs, group)
	s.Earlier, s.IdlePID = true, idlePID
	return s
}

func spanOf(hbs []store.Heartbeat, group []int) RunSpan {
	var s RunSpan
	for _, i := range group {
		h := hbs[i]
		if started := h.Started; !started.IsZero() && (s.Started.IsZero() || started.Before(s.Started)) {
			s.Started = started
		}
		if h.Time.After(s.Ended) {
			s.Ended = h.Time
		}
		s.PIDs = append(s.PIDs, h.PID)
		s.Owners = append(s.Owners, h.Owner)
	}
	return s
}
