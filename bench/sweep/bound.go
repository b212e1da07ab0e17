package main

import (
	"fmt"
	"runtime"
	"syscall"
	"time"
)

// What bound a run (bench/README.md, "Server- or runner-bound"): the
// servers, the process running regen's runner (and the in-process
// simulators), or the job's lane limits.
const (
	boundServer = "server"
	boundRunner = "runner"
	boundLimit  = "limit"
)

// The rule's thresholds.
const (
	// A server is saturated at a scrape when requests wait in its queue
	// or its KV pool is this full: it has more work than it can take.
	saturatedKV = 0.9
	// The servers bound the run when they were saturated in at least
	// this share of the bulk's scrapes (mean over the servers).
	serverBusyShare = 0.5
	// Otherwise the runner's process bound it when it used this share of
	// the cores it may use, or when the simulators' clock ran below this
	// share of the asked speed (the process was short of CPU).
	runnerCPUShare   = 0.8
	runnerSpeedShare = 0.9
)

// loadSample is the fleet's load at one scrape.
type loadSample struct {
	t        float64 // simulated seconds since the job's start
	busy     float64 // share of the servers saturated
	kv       float64 // mean KV usage
	queue    float64 // requests waiting, summed over the servers
	inFlight float64 // requests running or waiting, summed over the servers
}

func newLoadSample(t float64, now []gauges) loadSample {
	s := loadSample{t: t}
	for _, g := range now {
		if g.queue >= 1 || g.usage >= saturatedKV {
			s.busy++
		}
		s.kv += g.usage
		s.queue += g.queue
		s.inFlight += g.running + g.queue
	}
	if n := float64(len(now)); n > 0 {
		s.busy /= n
		s.kv /= n
	}
	return s
}

// load is the fleet's mean load over a run's bulk.
type load struct {
	busy, kv, queue, inFlight float64
	samples                   int
}

// meanLoad averages the samples taken up to simulated time until.
func meanLoad(samples []loadSample, until float64) load {
	var l load
	for _, s := range samples {
		if s.t > until {
			break
		}
		l.busy += s.busy
		l.kv += s.kv
		l.queue += s.queue
		l.inFlight += s.inFlight
		l.samples++
	}
	if n := float64(l.samples); n > 0 {
		l.busy, l.kv, l.queue, l.inFlight = l.busy/n, l.kv/n, l.queue/n, l.inFlight/n
	}
	return l
}

// usage is what the run's process used: CPU against the cores it may use,
// and the simulators' speed against the asked one.
type usage struct {
	cpuShare   float64 // CPU seconds / wall seconds / GOMAXPROCS
	speedShare float64 // simulated seconds / wall seconds / asked speed
}

// classify applies the rule: saturated servers first (the runner kept
// them fed, whatever it cost), then a process short of CPU, else the
// lane limits.
func classify(l load, u usage) string {
	switch {
	case l.samples > 0 && l.busy >= serverBusyShare:
		return boundServer
	case u.cpuShare >= runnerCPUShare || u.speedShare < runnerSpeedShare:
		return boundRunner
	default:
		return boundLimit
	}
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measureUsage is the process's share of its cores over wall (cpu spent
// in it) and the simulators' share of the asked speed over span, the real
// time their simSeconds were counted in.
func measureUsage(cpu, wall time.Duration, simSeconds float64, span time.Duration, speed float64) usage {
	u := usage{speedShare: 1}
	if wall > 0 {
		u.cpuShare = cpu.Seconds() / wall.Seconds() / float64(runtime.GOMAXPROCS(0))
	}
	if span > 0 && speed > 0 {
		u.speedShare = simSeconds / span.Seconds() / speed
	}
	return u
}

// boundNote says what bound a run and the figures that decided it.
func boundNote(l load, u usage) string {
	return fmt.Sprintf("%s (servers saturated %.0f%%, KV %.2f, queue %.1f, in flight %.0f; cpu %.0f%% of %d cores, speed %.0f%%)",
		classify(l, u), 100*l.busy, l.kv, l.queue, l.inFlight, 100*u.cpuShare, runtime.GOMAXPROCS(0), 100*u.speedShare)
}
