package supervise

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// member is one process of a process group as /proc shows it.
type member struct {
	PID   int
	State byte // R, S, D, T (stopped), Z (zombie), ...
	Comm  string
}

// alive reports whether the process still runs; a zombie has exited.
func (m member) alive() bool { return m.State != 'Z' && m.State != 'X' && m.State != 'x' }

// groupMembers lists the processes whose process group id is pgid by
// scanning /proc/*/stat. Processes that vanish mid-scan are skipped.
func groupMembers(pgid int) (map[int]member, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("scan /proc: %w", err)
	}
	out := make(map[int]member)
	var buf [512]byte
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		m, pg, ok := readStat(pid, buf[:])
		if ok && pg == pgid {
			out[pid] = m
		}
	}
	return out, nil
}

// readStat parses /proc/pid/stat: "pid (comm) state ppid pgrp ...". comm may
// hold spaces and parentheses, so fields are counted after the last ')'.
func readStat(pid int, buf []byte) (member, int, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return member{}, 0, false
	}
	n, _ := f.Read(buf)
	f.Close()
	b := buf[:n]
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open || end+2 >= len(b) {
		return member{}, 0, false
	}
	fields := strings.Fields(string(b[end+2:]))
	if len(fields) < 3 || len(fields[0]) == 0 {
		return member{}, 0, false
	}
	pg, err := strconv.Atoi(fields[2])
	if err != nil {
		return member{}, 0, false
	}
	return member{PID: pid, State: fields[0][0], Comm: string(b[open+1 : end])}, pg, true
}

// stoppedMembers lists the group's processes stopped by a signal (state T,
// e.g. SIGSTOP), sorted.
func stoppedMembers(pgid int) []int {
	ms, _ := groupMembers(pgid)
	var out []int
	for pid, m := range ms {
		if m.State == 'T' {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// processAlive reports whether pid runs (exists and is not a zombie).
func processAlive(pid int) bool {
	var buf [512]byte
	m, _, ok := readStat(pid, buf[:])
	return ok && m.alive()
}

// groupAlive reports whether any member of the group still runs.
func groupAlive(pgid int) bool {
	ms, err := groupMembers(pgid)
	if err != nil {
		// Without /proc fall back to signal 0, which also counts zombies.
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, m := range ms {
		if m.alive() {
			return true
		}
	}
	return false
}

// killGroup stops every process of the group: SIGTERM (and SIGCONT, so a
// stopped process can act on it), then SIGKILL once grace has passed; with
// no grace, SIGKILL at once. It returns when no member runs or after a
// bounded wait following SIGKILL.
func killGroup(pgid int, grace, poll time.Duration) error {
	if pgid <= 0 {
		return nil
	}
	if !groupAlive(pgid) {
		return nil
	}
	if grace > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		if waitGone(pgid, grace, poll) {
			return nil
		}
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill group %d: %w", pgid, err)
	}
	if waitGone(pgid, 10*time.Second, poll) {
		return nil
	}
	return fmt.Errorf("kill group %d: members still running 10s after SIGKILL", pgid)
}

func waitGone(pgid int, d, poll time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !groupAlive(pgid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(min(poll, 50*time.Millisecond))
	}
}

// gpuPIDs lists the PIDs nvidia-smi reports as compute processes.
func gpuPIDs(ctx context.Context, smi string) ([]int, error) {
	out, err := exec.CommandContext(ctx, smi, "--query-compute-apps=pid", "--format=csv,noheader").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --query-compute-apps: %w", smi, err)
	}
	var pids []int
	for _, line := range strings.Split(string(out), "\n") {
		if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// waitGPURelease polls nvidia-smi until none of pids holds GPU memory, at
// most timeout. It returns the PIDs still listed when it gave up.
func waitGPURelease(ctx context.Context, smi string, pids map[int]bool, timeout, every time.Duration) ([]int, error) {
	deadline := time.Now().Add(timeout)
	for {
		listed, err := gpuPIDs(ctx, smi)
		if err != nil {
			return nil, err
		}
		var held []int
		for _, p := range listed {
			if pids[p] {
				held = append(held, p)
			}
		}
		if len(held) == 0 {
			return nil, nil
		}
		if time.Now().After(deadline) {
			return held, fmt.Errorf("gpu memory still held by pids %v after %v", held, timeout)
		}
		select {
		case <-ctx.Done():
			return held, ctx.Err()
		case <-time.After(every):
		}
	}
}
