package bound

import (
	"fmt"
	"runtime"
	"syscall"
	"time"
)

// What bound a run (bench/README.md, "Server- or runner-bound").
const (
	Server = "server"
	Runner = "runner"
	Limit  = "limit"
)

// The rule's thresholds.
const (
	// A server is saturated at a scrape when requests wait in its queue
	// or its KV pool is this full: it has more work than it can take.
	SaturatedKV = 0.9
	// The runner's process bound the run when it used this share of the
	// cores it may use, or when the simulators' clock ran below this share
	// of the asked speed (the process was short of CPU).
	RunnerCPUShare   = 0.8
	RunnerSpeedShare = 0.9
	// Otherwise the servers bound it when they were saturated in at least
	// this share of the scrapes (mean over the servers).
	ServerBusyShare = 0.5
)

// Gauges are one server's load at one scrape.
type Gauges struct {
	Queue, Usage, Running float64
	// Slots is the server's request slots when it is slot-bound
	// (llama-server --parallel); every slot busy then saturates it too.
	// 0 when the server has no such limit.
	Slots float64
}

// saturated: the server has more work than it takes.
func (g Gauges) saturated() bool {
	return g.Queue >= 1 || g.Usage >= SaturatedKV || (g.Slots > 0 && g.Running >= g.Slots)
}

// Sample is the fleet's load at one scrape.
type Sample struct {
	T        float64 // simulated seconds since the job's start (the caller's clock)
	Busy     float64 // share of the servers saturated
	KV       float64 // mean KV usage
	Queue    float64 // requests waiting, summed over the servers
	InFlight float64 // requests running or waiting, summed over the servers
}

// NewSample is the fleet's load at time t from each server's gauges.
func NewSample(t float64, now []Gauges) Sample {
	s := Sample{T: t}
	for _, g := range now {
		if g.saturated() {
			s.Busy++
		}
		s.KV += g.Usage
		s.Queue += g.Queue
		s.InFlight += g.Running + g.Queue
	}
	if n := float64(len(now)); n > 0 {
		s.Busy /= n
		s.KV /= n
	}
	return s
}

// Load is the fleet's mean load over a stretch of samples.
type Load struct {
	Busy, KV, Queue, InFlight float64
	Samples                   int
}

// MeanLoad averages the samples taken up to time until.
func MeanLoad(samples []Sample, until float64) Load {
	var l Load
	for _, s := range samples {
		if s.T > until {
			break
		}
		l.Busy += s.Busy
		l.KV += s.KV
		l.Queue += s.Queue
		l.InFlight += s.InFlight
		l.Samples++
	}
	if n := float64(l.Samples); n > 0 {
		l.Busy, l.KV, l.Queue, l.InFlight = l.Busy/n, l.KV/n, l.Queue/n, l.InFlight/n
	}
	return l
}

// Usage is what the run's process used: CPU against the cores it may use,
// and the simulators' speed against the asked one.
type Usage struct {
	CPUShare   float64 // CPU seconds / wall seconds / GOMAXPROCS
	SpeedShare float64 // simulated seconds / wall seconds / asked speed (1 when nothing is paced)
}

// Classify applies the rule: a process short of CPU first (everything
// regen does in real time, its probes, claims and clients, then ran at
// another pace in simulated time than asked, whatever the servers' queues
// say), then saturated servers, else the lane limits.
func Classify(l Load, u Usage) string {
	switch {
	case u.CPUShare >= RunnerCPUShare || u.SpeedShare < RunnerSpeedShare:
		return Runner
	case l.Samples > 0 && l.Busy >= ServerBusyShare:
		return Server
	default:
		return Limit
	}
}

// CPUTime is the process's user and system time so far. It counts every
// goroutine, the in-process servers and clients included.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MeasureUsage is the process's share of its cores over wall (cpu spent
// in it) and the simulators' share of the asked speed over span, the real
// time their simSeconds were counted in.
func MeasureUsage(cpu, wall time.Duration, simSeconds float64, span time.Duration, speed float64) Usage {
	u := Usage{SpeedShare: 1}
	if wall > 0 {
		u.CPUShare = cpu.Seconds() / wall.Seconds() / float64(runtime.GOMAXPROCS(0))
	}
	if span > 0 && speed > 0 {
		u.SpeedShare = simSeconds / span.Seconds() / speed
	}
	return u
}

// Note says what bound a run and the figures that decided it (the
// sweep's wording).
func Note(l Load, u Usage) string {
	return fmt.Sprintf("%s (servers saturated %.0f%%, KV %.2f, queue %.1f, in flight %.0f; cpu %.0f%% of %d cores, speed %.0f%%)",
		Classify(l, u), 100*l.Busy, l.KV, l.Queue, l.InFlight, 100*u.CPUShare, runtime.GOMAXPROCS(0), 100*u.SpeedShare)
}
