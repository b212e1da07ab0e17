package monitor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// RegenAlive reports whether pid is a live regen process on this machine;
// a pid reused by an unrelated program after a crash does not count.
func RegenAlive(pid int) bool {
	if !ProcessAlive(pid) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return true // no /proc: trust the signal check
	}
	return bytes.Contains(cmdline, []byte("regen"))
}

// WorkerGone reports whether the worker of heartbeat hb no longer works
// the job, as a worker on host judges it at now: it exited, it ran on host
// and its process is gone, or its heartbeat is older than deadAfter. The
// last rule applies only when trustAge: after an outage of the judge's own
// store, everyone's heartbeat is stale.
func WorkerGone(hb store.Heartbeat, host string, now time.Time, deadAfter time.Duration, trustAge bool) bool {
	var beat Beat
	_ = json.Unmarshal(hb.Counters, &beat)
	return beat.Exited ||
		(hb.Host == host && !RegenAlive(hb.PID)) ||
		(trustAge && now.Sub(hb.Time) > deadAfter)
}
