package ui

import (
	"fmt"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// workerGroups splits a job's workers (newest heartbeat first) into those
// worth a block of their own and the rest, summed up in one line. Runs of
// the job that ended are history, not workers: a single-runner job
// restarted forty times has one runner (the "runner:" line), not forty dead
// workers. A block goes to every live worker and, when the job spans
// several hosts (a shared store), to the newest run of each host without a
// live one if it died or failed: its samples went back to the others, and
// its host may need a look. section says whether a workers section is worth
// printing at all: several live workers, or several hosts.
func workerGroups(ws []monitor.WorkerStatus) (shown []monitor.WorkerStatus, history string, section bool) {
	hosts := map[string]bool{}
	liveOn := map[string]bool{}
	live := 0
	for _, w := range ws {
		hosts[w.Host] = true
		if w.Live {
			live++
			liveOn[w.Host] = true
		}
	}
	section = live >= 2 || len(hosts) >= 2
	newest := map[string]bool{} // hosts whose newest run was seen
	var ended []monitor.WorkerStatus
	for i, w := range ws {
		first := !newest[w.Host]
		newest[w.Host] = true
		switch {
		case w.Live:
			shown = append(shown, w)
		case section && first && !liveOn[w.Host] && (w.State == monitor.Dead || w.State == monitor.Failed):
			shown = append(shown, w)
		case i == 0 && !section:
			// The newest run is the "runner:" line's.
		default:
			ended = append(ended, w)
		}
	}
	return shown, historyLine(ended), section
}

// historyLine sums up ended runs by how they ended: "earlier runs: 39 (35
// stopped, 3 dead, 1 finished), the last ended 12:03:04"; "" for none.
func historyLine(ended []monitor.WorkerStatus) string {
	if len(ended) == 0 {
		return ""
	}
	by := map[monitor.State]int{}
	var last time.Time
	for _, w := range ended {
		by[w.State]++
		if w.HeartbeatAt.After(last) {
			last = w.HeartbeatAt
		}
	}
	var parts []string
	for _, s := range []struct {
		state monitor.State
		word  string
	}{{monitor.Stopped, "stopped"}, {monitor.Dead, "dead"}, {monitor.Failed, "failed"}, {monitor.Done, "finished"}} {
		if n := by[s.state]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s.word))
		}
	}
	line := fmt.Sprintf("earlier runs: %d (%s)", len(ended), strings.Join(parts, ", "))
	if !last.IsZero() {
		line += ", the last ended " + last.Format("15:04:05")
	}
	return line
}

// liveCount counts the live workers.
func liveCount(ws []monitor.WorkerStatus) int {
	n := 0
	for _, w := range ws {
		if w.Live {
			n++
		}
	}
	return n
}

// workerLines lists the live workers sharing the job (a PostgreSQL store)
// and a dead host's last run, then one line for the runs that ended;
// nothing but that line for a job of one runner. With detail each worker's
// endpoints follow it.
func workerLines(r monitor.Report, detail bool, width int) []string {
	shown, history, section := workerGroups(r.Workers)
	var out []string
	if section {
		out = append(out, styleBold.Render(fmt.Sprintf("workers: %d live", liveCount(r.Workers))))
	}
	for _, w := range shown {
		if !section {
			break
		}
		line := fmt.Sprintf("  %s pid %d %s  heartbeat %s ago  done %d  %.2f samples/s  in flight %d",
			w.Host, w.PID, stateStyle(w.State).Render(string(w.State)), w.HeartbeatAge.Round(time.Second), w.Done, w.Rate, w.InFlight)
		if len(w.Lanes) > 0 {
			line += "  lanes " + strings.Join(w.Lanes, ",")
		}
		out = append(out, wrap(line, width, 4)...)
		if !detail {
			continue
		}
		for _, e := range w.Endpoints {
			l := "    " + e.URL + " " + stateStyle(e.State).Render(string(e.State))
			if e.Cause != "" {
				l += " (" + e.Cause + ")"
			}
			out = append(out, wrap(l, width, 6)...)
		}
		for _, ev := range w.Evidence {
			out = append(out, wrap("    "+ev, width, 6)...)
		}
	}
	if history != "" {
		out = append(out, wrap(styleMuted.Render(history), width, 2)...)
	}
	if len(out) == 0 {
		return nil
	}
	return append(out, "")
}
