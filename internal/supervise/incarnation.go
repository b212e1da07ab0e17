package supervise

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/regen-dev/regen/internal/probe"
)

type outcome struct {
	stopped  bool
	cause    string
	evidence []string
}

type exitInfo struct {
	state *os.ProcessState
	err   error
}

// incarnation is one launch of the server.
type incarnation struct {
	cmd      *exec.Cmd
	pid      int
	watch    *logWatch
	exited   chan exitInfo
	logDone  chan struct{}
	readyCh  chan struct{}
	probes   chan probe.Snapshot
	pipe     *os.File
	seenPIDs map[int]bool
}

// runOnce launches the server, waits for it to fail or for ctx to end, and
// cleans up the group before returning.
func (s *Supervisor) runOnce(ctx context.Context, restarts int) outcome {
	argv := s.Argv()
	ictx, cancel := context.WithCancel(ctx)
	// wg holds the log reader and the probe loops only: they end when ictx
	// is cancelled or drain closes the pipe, so this wait is bounded.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	var logOut io.Writer
	if s.cfg.LogPath != "" {
		rf, err := openRotating(s.cfg.LogPath, s.cfg.LogMaxBytes, s.cfg.LogKeep)
		if err != nil {
			return s.startFailed(fmt.Errorf("server log %s: %w", s.cfg.LogPath, err))
		}
		defer rf.Close()
		fmt.Fprintf(rf, "# regen: launch %d at %s: %s\n", restarts+1, s.cfg.Now().Format(time.RFC3339), strings.Join(quoteArgs(argv), " "))
		logOut = rf
	}

	pr, pw, err := os.Pipe()
	if err != nil {
		return s.startFailed(fmt.Errorf("pipe: %w", err))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.cfg.Dir
	cmd.Env = mergeEnv(os.Environ(), s.server.Env)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	inc := &incarnation{
		cmd:      cmd,
		watch:    newLogWatch(s.cfg.Dialect, logOut, s.cfg.Now),
		exited:   make(chan exitInfo, 1),
		logDone:  make(chan struct{}),
		readyCh:  make(chan struct{}),
		probes:   make(chan probe.Snapshot),
		pipe:     pr,
		seenPIDs: make(map[int]bool),
	}
	started := make(chan error, 1)
	// The reaper is not in wg: a killed leader stuck in uninterruptible
	// sleep (a GPU driver call) is never reaped, and drain gives up on it
	// after a bounded wait. Waiting for the reaper here would then hang
	// runOnce, and with it every restart, forever. Left alone it stays
	// harmless: exited is buffered, so its one send never blocks.
	go func() {
		// Pdeathsig fires when the thread that forked the child exits, not
		// the process, so that thread stays locked until the child is reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := s.cfg.reap(cmd)
		inc.exited <- exitInfo{state: cmd.ProcessState, err: err}
	}()
	err = <-started
	pw.Close()
	if err != nil {
		pr.Close()
		return s.startFailed(fmt.Errorf("start %s: %w", argv[0], err))
	}
	inc.pid = cmd.Process.Pid
	inc.seenPIDs[inc.pid] = true
	wg.Go(func() {
		defer close(inc.logDone)
		inc.watch.run(pr)
	})
	defer pr.Close()
	s.log.Info("server_launch", "pid", inc.pid, "argv", argv, "launch", restarts+1)
	s.setState(Starting, "", []string{"pid " + strconv.Itoa(inc.pid), "argv " + strings.Join(quoteArgs(argv), " ")}, inc.pid)

	wg.Go(func() { s.pollReady(ictx, inc) })
	return s.watchLoop(ctx, ictx, inc, &wg)
}

func (s *Supervisor) startFailed(err error) outcome {
	s.setState(Down, CauseStart, []string{err.Error()}, 0)
	s.log.Error("server_start", "err", err)
	return outcome{cause: CauseStart, evidence: []string{err.Error()}}
}

// drain waits for the leader to be reaped and the log reader to finish.
// A process outside the group may still hold the pipe, so the wait is bounded.
func (s *Supervisor) drain(inc *incarnation) {
	select {
	case <-inc.exited:
	case <-time.After(s.cfg.KillGrace + s.cfg.reapGrace):
		s.log.Error("server_reap", "pid", inc.pid, "err", "leader not reaped")
	}
	select {
	case <-inc.logDone:
	case <-time.After(2 * time.Second):
		inc.pipe.Close() // unblocks the reader
		<-inc.logDone
	}
	inc.watch.mu.Lock()
	werr := inc.watch.writeErr
	inc.watch.mu.Unlock()
	if werr != nil {
		s.log.Error("server_log", "path", s.cfg.LogPath, "err", werr)
	}
}

func describeExit(ex exitInfo) string {
	st := ex.state
	if st == nil {
		return fmt.Sprintf("leader exited: %v", ex.err)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("leader pid %d killed by signal %s", st.Pid(), ws.Signal())
	}
	return fmt.Sprintf("leader pid %d exited with code %d", st.Pid(), st.ExitCode())
}

// mergeEnv overrides base with extra; new keys are appended in sorted order.
func mergeEnv(base []string, extra map[string]string) []string {
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := extra[k]; ok {
			continue
		}
		out = append(out, kv)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+extra[k])
	}
	return out
}

func quoteArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}
