package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/store/postgres"
)

// TestE2ESlurm submits examples/slurm/regen.sbatch itself to a real one-host
// Slurm cluster (two tasks, each a `regen run` worker with its own
// simulator, sharing the test's PostgreSQL), cancels it with scancel while
// it runs, and submits it again: the second job finishes the first one's
// work, every sample is stored and exported exactly once, `regen status`
// says DONE and lists the four workers, and squeue and sacct (the job
// completion log) agree on what became of each job.
func TestE2ESlurm(t *testing.T) {
	t.Parallel()
	cluster := startSlurm(t)
	dir, want, env, dsn := pgJob(t, "slurm", 250, 15)
	script, err := filepath.Abs("../../examples/slurm/regen.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	env = append(env, "REGEN_JOB="+filepath.Join(dir, "job.yaml"), "REGEN_BIN="+regenBin)
	// Two workers on the one node, no GPUs: sbatch options override the
	// script's #SBATCH lines, as on a real cluster.
	submit := func() string {
		out := cluster.run(t, dir, env, "sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2",
			"--gpus-per-node=0", "--cpus-per-task=1", script)
		return strings.TrimSpace(strings.SplitN(out, ";", 2)[0])
	}

	first := submit()
	done := waitDone(t, cluster, first, dsn, "slurm", len(want)/4)
	if s := cluster.queueState(t, first); s != "RUNNING" {
		t.Fatalf("job %s with %d of %d samples done: squeue says %q, want RUNNING", first, done, len(want), s)
	}
	if s, ok := cluster.finalStates(t)[first]; ok {
		t.Errorf("sacct -c lists running job %s as %q", first, s)
	}
	t.Logf("job %s: squeue RUNNING with %d of %d samples done; scancel", first, done, len(want))
	cluster.run(t, dir, nil, "scancel", first)
	waitLeft(t, cluster, first)
	checkEnded(t, cluster, first, "CANCELLED")
	if n := pgCount(t, dsn, "slurm", "done"); n >= len(want) {
		t.Fatalf("all %d samples done before the cancel took effect: nothing left for the resubmission", n)
	}
	cancelled := time.Now()

	second := submit()
	waitLeft(t, cluster, second)
	checkEnded(t, cluster, second, "COMPLETED")
	t.Logf("sacct -c:\n%s", cluster.run(t, dir, nil, "sacct", "-c", "-o", "jobid,jobname,state,exitcode,nnodes"))
	out, err := os.ReadFile(filepath.Join(dir, "regen-"+second+".out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("job %s output:\n%s", second, out)
	checkSlurmOutput(t, string(out))

	checkExport(t, filepath.Join(dir, "out"), "slurm", want, false)
	checkAllOnce(t, dsn, "slurm", len(want))
	checkSlurmWorkers(t, dir, env, cluster.node, cancelled)
}

// waitDone waits until at least n samples of the job are done in the store
// while Slurm job id runs, and returns how many are.
func waitDone(t *testing.T, c *slurmCluster, id, dsn, job string, n int) int {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if got := pgCount(t, dsn, job, "done"); got >= n {
			return got
		}
		if s := c.queueState(t, id); s != "RUNNING" && s != "PENDING" && s != "CONFIGURING" {
			b, _ := os.ReadFile(filepath.Join(c.dir, "log", "jobcomp.txt"))
			t.Fatalf("job %s left the queue (%q) before %d samples were done:\n%s\n%s", id, s, n, b, c.logs())
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d samples done after 3 minutes\n%s", n, c.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitLeft waits until job id has left squeue's default list (pending,
// running, completing) and its end is in the completion log.
func waitLeft(t *testing.T, c *slurmCluster, id string) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		if c.queueState(t, id) == "" {
			if _, ok := c.finalStates(t)[id]; ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still queued after 4 minutes (squeue %q)\n%s", id, c.queueState(t, id), c.logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkEnded checks that squeue (its record of ended jobs, -t all) and
// sacct (the completion log) both say job id ended in state want; a
// COMPLETED job with exit code 0:0.
func checkEnded(t *testing.T, c *slurmCluster, id, want string) {
	t.Helper()
	queue := strings.TrimSpace(c.run(t, c.dir, nil, "squeue", "-h", "-t", "all", "-j", id, "-o", "%T"))
	acct := c.finalStates(t)[id]
	t.Logf("job %s: squeue -t all %q, sacct -c %q", id, queue, acct)
	state, exit, _ := strings.Cut(acct, " ")
	if queue != want || state != want || (want == "COMPLETED" && exit != "0:0") {
		t.Errorf("job %s: squeue says %q and sacct %q, want %s in both", id, queue, acct, want)
	}
}

// pgCount counts the job's samples in a state; 0 while the schema does not
// exist yet.
func pgCount(t *testing.T, dsn, job, state string) int {
	t.Helper()
	codes := map[string]int{"pending": 0, "leased": 1, "done": 2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	schema := pgx.Identifier{postgres.SchemaFor(job)}.Sanitize()
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.samples WHERE state = $1`, codes[state]).Scan(&n); err != nil {
		return 0
	}
	return n
}

// checkSlurmOutput checks the resubmitted job's output file: both tasks
// ran regen (srun --label prefixes each line with its task), exactly one
// exported, and the script's closing `regen status` said DONE.
func checkSlurmOutput(t *testing.T, out string) {
	t.Helper()
	for _, task := range []string{"0", "1"} {
		if !regexp.MustCompile(`(?m)^` + task + `: regen: job slurm, store postgres://`).MatchString(out) {
			t.Errorf("no regen run started in task %s", task)
		}
	}
	exported := len(regexp.MustCompile(`(?m)^[01]: .*output: sharegpt +\d+ rows`).FindAllString(out, -1))
	waited := len(regexp.MustCompile(`(?m)^[01]: .*export: already written by another worker`).FindAllString(out, -1))
	if exported != 1 || waited != 1 {
		t.Errorf("%d tasks exported and %d found the export written, want 1 and 1", exported, waited)
	}
	if !regexp.MustCompile(`(?m)^job slurm: DONE$`).MatchString(out) {
		t.Error("the script's closing regen status does not say DONE")
	}
}

// checkSlurmWorkers checks `regen status`: the job DONE, and four workers
// on the node: two from the cancelled job (started before cancelled, no
// longer live) and two from the resubmission, both DONE, that finished
// samples.
func checkSlurmWorkers(t *testing.T, dir string, env []string, node string, cancelled time.Time) {
	t.Helper()
	rep, res := pgStatus(t, dir, env)
	t.Logf("regen status:\n%s", regenEnv(t, dir, env, "status", "job.yaml").stdout)
	if rep.State != monitor.Done || res.code != 0 {
		t.Errorf("status: %s exit %d, want DONE exit 0\n%s", rep.State, res.code, res)
	}
	var before, after int
	for _, w := range rep.Workers {
		if w.Host != node {
			t.Errorf("worker pid %d on host %q, want %q", w.PID, w.Host, node)
		}
		if w.Live {
			t.Errorf("worker pid %d still live after both jobs ended", w.PID)
		}
		if w.Started.Before(cancelled) {
			before++
			continue
		}
		after++
		if w.State != monitor.Done || w.Done == 0 {
			t.Errorf("resubmitted worker pid %d: %s with %d samples, want DONE with some", w.PID, w.State, w.Done)
		}
	}
	if before != 2 || after != 2 {
		t.Errorf("status lists %d workers of the cancelled job and %d of the resubmission, want 2 and 2:\n%s", before, after, res.stdout)
	}
}
