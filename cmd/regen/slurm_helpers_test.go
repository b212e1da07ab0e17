package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// slurmCluster is a one-host Slurm cluster a test starts for itself: its
// own munge key and socket, slurm.conf, state and spool directories, ports
// below 32768, and munged, slurmctld and slurmd as children of the test,
// stopped by PID when it ends. Accounting is the job completion log
// (jobcomp/filetxt), which `sacct -c` reads without slurmdbd.
type slurmCluster struct {
	dir   string // root of every file the cluster uses
	node  string // this host's short name: the one node
	conf  string // slurm.conf
	bin   map[string]string
	procs []*exec.Cmd
}

// slurmTools are the programs the Slurm test runs.
var slurmTools = []string{"munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sacct", "sinfo"}

// slurmBins finds the programs: on PATH, or in /usr/sbin where Debian puts
// the daemons (not on a plain user's PATH).
func slurmBins() (bins map[string]string, missing []string) {
	bins = map[string]string{}
	for _, tool := range slurmTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			if _, serr := os.Stat(filepath.Join("/usr/sbin", tool)); serr != nil {
				missing = append(missing, tool)
				continue
			}
			p = filepath.Join("/usr/sbin", tool)
		}
		bins[tool] = p
	}
	return bins, missing
}

// startSlurm starts the cluster. Without the Slurm or munge programs it
// skips the test, or fails it under CI=true: CI installs them (.ci/run).
func startSlurm(t *testing.T) *slurmCluster {
	t.Helper()
	bins, missing := slurmBins()
	if len(missing) > 0 {
		msg := fmt.Sprintf("no %s on PATH: apt-get install slurm-wlm munge", strings.Join(missing, ", "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED LOUDLY: " + msg)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// munged insists that every directory on its socket's path be
	// searchable by all, which t.TempDir (0700) is not.
	dir, err := os.MkdirTemp("/tmp", "regen-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	c := &slurmCluster{dir: dir, node: strings.SplitN(host, ".", 2)[0], conf: filepath.Join(dir, "slurm.conf"), bin: bins}
	t.Cleanup(func() {
		c.stop(t)
		os.RemoveAll(dir)
	})
	for _, d := range []string{"", "munge", "state", "spool", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.startMunge(t)
	c.writeConf(t, me.Username, slurmPorts(t))
	c.start(t, "slurmctld", "-D", "-i", "-f", c.conf)
	c.start(t, "slurmd", "-D", "-f", c.conf)
	c.waitIdle(t)
	return c
}

// startMunge writes a fresh key (0400, owned by the user munged runs as:
// this one) and starts munged on the cluster's own socket.
func (c *slurmCluster) startMunge(t *testing.T) {
	t.Helper()
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(rand.UintN(256))
	}
	keyPath := filepath.Join(c.dir, "munge", "munge.key")
	if err := os.WriteFile(keyPath, key, 0o400); err != nil {
		t.Fatal(err)
	}
	m := filepath.Join(c.dir, "munge")
	c.start(t, "munged", "-F", "--socket="+c.mungeSocket(), "--key-file="+keyPath,
		"--pid-file="+filepath.Join(m, "munged.pid"), "--seed-file="+filepath.Join(m, "munged.seed"),
		"--log-file="+filepath.Join(m, "munged.log"))
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := exec.Command(c.bin["munge"], "-n", "-S", c.mungeSocket()).CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("munged not answering after 20 s: %v\n%s\n%s", err, out, c.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *slurmCluster) mungeSocket() string { return filepath.Join(c.dir, "munge", "munge.sock") }

// slurmPorts picks slurmctld's and slurmd's ports and a range for srun's
// own listeners, all below 32768 and free now.
func slurmPorts(t *testing.T) [3]int {
	t.Helper()
	for range 200 {
		base := 20000 + rand.IntN(12000-200)
		ok := true
		for _, p := range []int{base, base + 1} {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return [3]int{base, base + 1, base + 2}
		}
	}
	t.Fatal("no two free ports in 20000-31999")
	return [3]int{}
}

// writeConf writes slurm.conf: one node (this host, at 127.0.0.1, with 4
// CPUs whatever the hardware has), one partition, no cgroups, no slurmdbd.
func (c *slurmCluster) writeConf(t *testing.T, userName string, ports [3]int) {
	t.Helper()
	d := func(name string) string { return filepath.Join(c.dir, name) }
	conf := fmt.Sprintf(`ClusterName=regentest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
SrunPortRange=%[4]d-%[5]d
SlurmUser=%[6]s
SlurmdUser=%[6]s
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[7]s
StateSaveLocation=%[8]s
SlurmdSpoolDir=%[9]s
SlurmctldPidFile=%[10]s
SlurmdPidFile=%[11]s
SlurmctldLogFile=%[12]s
SlurmdLogFile=%[13]s
JobCompType=jobcomp/filetxt
JobCompLoc=%[14]s
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=4 RealMemory=2000 State=UNKNOWN
PartitionName=regen Nodes=%[1]s Default=YES MaxTime=INFINITE State=UP
`, c.node, ports[0], ports[1], ports[2], ports[2]+99, userName, c.mungeSocket(),
		d("state"), d("spool"), d("slurmctld.pid"), d("slurmd.pid"),
		d("log/slurmctld.log"), d("log/slurmd.log"), d("log/jobcomp.txt"))
	if err := os.WriteFile(c.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs a daemon in the foreground as a child of the test; it dies
// with the test binary even if that is killed.
func (c *slurmCluster) start(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := c.command(name, args...)
	out, err := os.Create(filepath.Join(c.dir, "log", name+".out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	c.procs = append(c.procs, cmd)
}

// stop cancels the jobs a failed test left running (their tasks are
// slurmstepd's children, not the test's), then ends the daemons by PID, the
// last started first, and waits for them.
func (c *slurmCluster) stop(t *testing.T) {
	if len(c.procs) == 3 {
		c.cancelAll(t)
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Logf("%s (pid %d) ignored SIGTERM for 10 s: killed", p.Path, p.Process.Pid)
			_ = p.Process.Kill()
			<-done
		}
	}
	c.procs = nil
}

// cancelAll cancels every job of the cluster and waits up to 30 s for the
// queue to empty.
func (c *slurmCluster) cancelAll(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		return
	}
	if out, err := c.command("scancel", "--user", me.Username).CombinedOutput(); err != nil {
		t.Logf("scancel --user %s: %v\n%s", me.Username, err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, err := c.command("squeue", "-h", "-o", "%i").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("jobs still queued 30 s after scancel\n%s", c.logs())
}

// env is the environment of a Slurm command: this cluster's slurm.conf,
// plus extra.
func (c *slurmCluster) env(extra []string) []string {
	return append(append(os.Environ(), "SLURM_CONF="+c.conf), extra...)
}

// command is a Slurm client command on this cluster.
func (c *slurmCluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.bin[name], args...)
	cmd.Env = c.env(nil)
	return cmd
}

// run runs a Slurm client command in dir and returns its stdout; a failure
// fails the test with the daemons' logs.
func (c *slurmCluster) run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := c.command(name, args...)
	cmd.Dir, cmd.Env = dir, c.env(env)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s\n%s", name, strings.Join(args, " "), err, out, stderr.String(), c.logs())
	}
	return string(out)
}

// waitIdle waits until the node has registered and is idle.
func (c *slurmCluster) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := c.command("sinfo", "-h", "-N", "-o", "%t").Output()
		if err == nil && strings.TrimSpace(string(out)) == "idle" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not idle after 60 s: sinfo %q %v\n%s", c.node, out, err, c.logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// queueState is the job's state as squeue has it: "" once it has left the
// queue (squeue lists pending, running and completing jobs by default).
func (c *slurmCluster) queueState(t *testing.T, id string) string {
	t.Helper()
	out, err := c.command("squeue", "-h", "-j", id, "-o", "%T").Output()
	if err != nil {
		return "" // an id purged from slurmctld's memory
	}
	return strings.TrimSpace(string(out))
}

// finalStates reads the completion log through `sacct -c`: job id to state
// and exit code, for every job that has ended.
func (c *slurmCluster) finalStates(t *testing.T) map[string]string {
	t.Helper()
	out := c.run(t, c.dir, nil, "sacct", "-c", "-n", "-P", "-o", "jobid,state,exitcode")
	states := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Split(line, "|"); len(f) == 3 {
			states[f[0]] = f[1] + " " + f[2]
		}
	}
	return states
}

// logs is the tail of every daemon log, for failure messages.
func (c *slurmCluster) logs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.dir, "log", "*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(f), tail(data, 15))
	}
	return b.String()
}
