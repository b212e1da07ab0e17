package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTime is the process's user+system CPU time. It counts every goroutine,
// in-process servers and clients included, so regen and its reference are
// always measured with the same surroundings.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// span is the wall and CPU time of one measured stretch.
type span struct {
	wall, cpu time.Duration
	mallocs   uint64
}

type spanStart struct {
	t       time.Time
	cpu     time.Duration
	mallocs uint64
}

func startSpan() spanStart {
	return spanStart{t: time.Now(), cpu: cpuTime(), mallocs: mallocs()}
}

func (s spanStart) end() span {
	return span{wall: time.Since(s.t), cpu: cpuTime() - s.cpu, mallocs: mallocs() - s.mallocs}
}

var mallocSample = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}

// mallocs is the cumulative count of heap allocations, read without
// stopping the world.
func mallocs() uint64 {
	metrics.Read(mallocSample)
	if mallocSample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return mallocSample[0].Value.Uint64()
}

// heapInUse is runtime.MemStats.HeapInuse (spans holding objects plus
// their free slots), read through runtime/metrics so sampling it does not
// stop the world.
func heapInUse() uint64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
	metrics.Read(s)
	var n uint64
	for _, v := range s {
		if v.Value.Kind() == metrics.KindUint64 {
			n += v.Value.Uint64()
		}
	}
	return n
}

// heapPeak samples heapInUse every few milliseconds until stopped.
type heapPeak struct {
	base uint64
	peak uint64
	stop chan struct{}
	done chan struct{}
}

// startHeapPeak collects garbage first, so the baseline is what is live,
// then samples in the background.
func startHeapPeak() *heapPeak {
	runtime.GC()
	p := &heapPeak{base: heapInUse(), stop: make(chan struct{}), done: make(chan struct{})}
	p.peak = p.base
	go func() {
		defer close(p.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			p.peak = max(p.peak, heapInUse())
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// Stop returns the peak heap in use above the baseline.
func (p *heapPeak) Stop() uint64 {
	close(p.stop)
	<-p.done
	p.peak = max(p.peak, heapInUse())
	return p.peak - p.base
}

// resetPeakRSS returns freed memory to the OS and resets the kernel's
// peak-RSS mark (VmHWM) to the current RSS, so the next peakRSS covers only
// what follows. It returns the RSS it reset to and false when the kernel
// does not allow the reset (then VmHWM is the whole process's peak).
func resetPeakRSS() (uint64, bool) {
	debug.FreeOSMemory()
	err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return procStatus("VmRSS"), err == nil
}

// peakRSS is VmHWM in bytes (0 where /proc is missing).
func peakRSS() uint64 { return procStatus("VmHWM") }

// peakRSSUnavailable is the detail line for a case whose per-side peak RSS
// could not be measured because resetPeakRSS was refused.
func peakRSSUnavailable() string {
	return fmt.Sprintf("peak RSS per side unavailable (clear_refs refused); process VmHWM is %.0f MiB", float64(peakRSS())/mib)
}

func procStatus(key string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return 0
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

const mib = 1 << 20
