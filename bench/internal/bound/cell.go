package bound

import (
	"fmt"
	"runtime"
	"strings"
)

// Cell is one measured side of a comparison and what bound it.
type Cell struct {
	Class string
	Load  Load
	Usage Usage
	Cores int // GOMAXPROCS when it was measured
	// Servers is how many servers' metrics were read: 0 for a plain
	// server that has none (its queue is unknown, it is never saturated).
	Servers int
	// Paced: a clock (a simulator's, a pacing ticker's) was compared with
	// the speed asked of it; otherwise SpeedShare is 1 and says nothing.
	Paced bool
}

// NewCell classifies a measured load and usage.
func NewCell(l Load, u Usage, servers int, paced bool) Cell {
	return Cell{Class: Classify(l, u), Load: l, Usage: u, Cores: runtime.GOMAXPROCS(0), Servers: servers, Paced: paced}
}

// Merge is the cell of several runs of one side (rounds reported by their
// median): their mean load and usage, classified again.
func Merge(cells ...Cell) Cell {
	var l Load
	var u Usage
	out := Cell{}
	n := float64(len(cells))
	for _, c := range cells {
		l.Busy += c.Load.Busy / n
		l.KV += c.Load.KV / n
		l.Queue += c.Load.Queue / n
		l.InFlight += c.Load.InFlight / n
		l.Samples += c.Load.Samples
		u.CPUShare += c.Usage.CPUShare / n
		u.SpeedShare += c.Usage.SpeedShare / n
		out.Servers, out.Paced, out.Cores = max(out.Servers, c.Servers), out.Paced || c.Paced, max(out.Cores, c.Cores)
	}
	out.Class, out.Load, out.Usage = Classify(l, u), l, u
	return out
}

// Evidence is the class and the figures that decided it.
func (c Cell) Evidence() string {
	server := "no server metrics"
	if c.Servers > 0 {
		server = fmt.Sprintf("saturated %.0f%%, KV %.2f, queue %.1f, in flight %.0f", 100*c.Load.Busy, c.Load.KV, c.Load.Queue, c.Load.InFlight)
	}
	speed := "nothing paced"
	if c.Paced {
		speed = fmt.Sprintf("sim speed %.0f%%", 100*c.Usage.SpeedShare)
	}
	return fmt.Sprintf("%s (%s; CPU %.2f of %d cores, %s)", c.Class, server, c.Usage.CPUShare*float64(c.Cores), c.Cores, speed)
}

// Why says what made a runner-bound cell so ("" for another class).
func (c Cell) Why() string {
	if c.Class != Runner {
		return ""
	}
	var why []string
	if c.Usage.CPUShare >= RunnerCPUShare {
		why = append(why, fmt.Sprintf("CPU %.1f of %d cores", c.Usage.CPUShare*float64(c.Cores), c.Cores))
	}
	if c.Usage.SpeedShare < RunnerSpeedShare {
		why = append(why, fmt.Sprintf("sim speed %.0f%% of asked", 100*c.Usage.SpeedShare))
	}
	return strings.Join(why, ", ")
}

// Side is a cell with the name a table gives it.
type Side struct {
	Name string
	Cell Cell
}

// Withheld is why a ratio between the sides is not reported: one of them
// was runner-bound, so the ratio would measure the machine. "" when the
// ratio stands.
func Withheld(sides ...Side) string {
	var why []string
	for _, s := range sides {
		if w := s.Cell.Why(); w != "" {
			why = append(why, strings.TrimSpace(s.Name+" "+w))
		}
	}
	if len(why) == 0 {
		return ""
	}
	return "runner-bound: " + strings.Join(why, "; ")
}
