package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/monitor"
)

// readmeBlock is one fenced block of README.md marked runnable.
type readmeBlock struct {
	line     int // of the opening fence
	commands []string
}

// runnableBlocks returns the fenced blocks that follow a line starting with
// "<!-- runnable", each command with its continuation lines joined.
func runnableBlocks(t *testing.T, readme string) []readmeBlock {
	t.Helper()
	lines := strings.Split(readme, "\n")
	var blocks []readmeBlock
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "<!-- runnable") {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Fatalf("README.md:%d: a runnable marker must be followed by a fenced block", i+1)
		}
		b := readmeBlock{line: i + 2}
		cmd := ""
		for i += 2; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			l := strings.TrimSpace(lines[i])
			if strings.HasSuffix(l, "\\") {
				cmd += strings.TrimSuffix(l, "\\") + " "
				continue
			}
			cmd += l
			if cmd != "" && !strings.HasPrefix(cmd, "#") {
				b.commands = append(b.commands, cmd)
			}
			cmd = ""
		}
		blocks = append(blocks, b)
	}
	return blocks
}

// copyExamples copies examples/ into dst/examples as a fresh clone holds
// it (copyTree), without the stores, outputs and logs a run leaves behind.
func copyExamples(t *testing.T, dst string) {
	t.Helper()
	copyTree(t, examplesDir, filepath.Join(dst, "examples"))
}

// readmeTestCommand is the README's test command. Its -timeout covers a
// loaded 2-core machine: go test's default 10 minutes is a hang guard per
// package, and the slowest package (this one) takes minutes (issue 30).
const readmeTestCommand = "go test -race -timeout 30m ./..."

// checkCIRunsREADME: CI's script runs exactly the README's test command.
func checkCIRunsREADME(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(repoRoot + "/.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var tests []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "go test") {
			tests = append(tests, strings.TrimSpace(l))
		}
	}
	if len(tests) != 1 || tests[0] != readmeTestCommand {
		t.Errorf(".ci/run runs %q; it must run the README's test command %q and no other go test", tests, readmeTestCommand)
	}
}

// TestREADME runs every runnable block of README.md, in order, in a copy of
// examples/ with the regen binary built for this test, as a newcomer would
// type them into a fresh clone; any non-zero exit fails. Commands are taken
// as written except that the binary is this test's: "go run ./cmd/regen",
// "./regen" and "regen" run it, "go build -o regen ./cmd/regen" is what
// built it, and "go test" lines are not run (this test is part of them):
// in their place the tests' copies of examples are checked against the
// tree the demo left behind (checkCopiesIgnoreRuns).
//
// The demo job runs here once, so this is also the demo's end-to-end test:
// every good input sample comes out exactly once, the broken rows are dead
// letters with their file:line in source order, and the re-run adds nothing.
func TestREADME(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := runnableBlocks(t, string(readme))
	if len(blocks) < 4 {
		t.Fatalf("README.md has %d runnable blocks; the test expects the demo, its follow-up, validate, plan and sim", len(blocks))
	}
	if first := blocks[0].commands; len(first) != 2 || first[0] != "go run ./cmd/regen run examples/demo/job.yaml" || first[1] != readmeTestCommand {
		t.Errorf("README's first commands are %q; they must stay the demo run and the test command %q", first, readmeTestCommand)
	}
	checkCIRunsREADME(t)
	root := t.TempDir()
	copyExamples(t, root)
	shipped := gitCheckout(t, root)
	demo := filepath.Join(root, "examples", "demo")
	want, badLines := demoInput(t, filepath.Join(demo, "data"))
	if diff := cmp.Diff([]int{43, 138, 253}, badLines); diff != "" {
		t.Fatalf("bad lines of the demo input (-want +got):\n%s", diff)
	}
	if len(want) != 600 {
		t.Fatalf("demo input has %d good samples, want 600", len(want))
	}

	var runs []result // each `regen run` of the demo, in order
	for _, b := range blocks {
		for _, c := range b.commands {
			args, ok := readmeCommand(t, c)
			if strings.HasPrefix(c, "go test ") {
				// Where a newcomer runs the tests, in the tree the demo left.
				checkCopiesIgnoreRuns(t, root, shipped)
			}
			if !ok {
				t.Logf("README.md:%d: skipped %q", b.line, c)
				continue
			}
			res := regenShell(t, root, args)
			if res.code != 0 {
				t.Fatalf("README.md:%d: %q exits %d\n%s", b.line, c, res.code, res)
			}
			t.Logf("README.md:%d: %q: %s", b.line, c, res.dur.Round(time.Millisecond))
			if strings.HasPrefix(args, "run examples/demo/job.yaml") {
				runs = append(runs, res)
			}
		}
	}
	checkDemo(t, demo, want, runs)
	checkDemoIgnored(t, root)
}

// checkDemoIgnored: everything the README's commands created beside the
// demo is ignored by the repository's .gitignore, so `git status` stays
// clean after the demo (issue 21: demo.db.locks/ showed up untracked).
func checkDemoIgnored(t *testing.T, root string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, "examples", "demo", "demo.db.locks")); err != nil {
		t.Fatalf("the demo left no runner lock folder to check: %v", err)
	}
	gitignore, err := os.ReadFile("../../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, ".gitignore"), gitignore, 0o644); err != nil {
		t.Fatal(err)
	}
	git := func(dir string, args ...string) []string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	shipped := map[string]bool{}
	for _, f := range git("../..", "ls-files", "examples/demo") {
		shipped[f] = true
	}
	git(root, "init", "-q")
	for _, line := range git(root, "status", "--porcelain", "--untracked-files=all", "examples/demo") {
		if f, ok := strings.CutPrefix(line, "?? "); ok && !shipped[f] {
			t.Errorf("the demo created %s, which git status shows untracked; ignore it in .gitignore", f)
		}
	}
}

// readmeCommand maps a README command to the arguments of this test's
// regen binary; ok is false for a command the test does not run.
func readmeCommand(t *testing.T, c string) (args string, ok bool) {
	t.Helper()
	switch {
	case strings.HasPrefix(c, "go test "):
		return "", false // this test is part of that command
	case c == "go build -o regen ./cmd/regen":
		return "", false // TestMain built the binary from the same source
	case strings.HasPrefix(c, "go run ./cmd/regen "):
		return strings.TrimPrefix(c, "go run ./cmd/regen "), true
	case strings.HasPrefix(c, "./regen "):
		return strings.TrimPrefix(c, "./regen "), true
	case strings.HasPrefix(c, "regen "):
		return strings.TrimPrefix(c, "regen "), true
	}
	t.Fatalf("README command %q: the test knows how to run go run ./cmd/regen, ./regen, regen, go build -o regen ./cmd/regen and go test", c)
	return "", false
}

// regenShell runs `regen <args>` through the shell (the README's quoting
// and globs apply) in dir.
func regenShell(t *testing.T, dir, args string) result {
	t.Helper()
	cmd := exec.Command("bash", "-c", `"$REGEN" `+args)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "REGEN="+regenBin, "NO_COLOR=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	guard := time.AfterFunc(hangGuard, func() { _ = cmd.Process.Kill() })
	err := cmd.Run()
	guard.Stop()
	res := result{args: []string{args}, stdout: out.String(), stderr: errOut.String(), dur: time.Since(start), code: cmd.ProcessState.ExitCode()}
	if err != nil && res.code < 0 {
		t.Fatalf("regen %s: %v", args, err)
	}
	return res
}

// checkDemo checks what the README's demo runs produced.
func checkDemo(t *testing.T, dir string, want []string, runs []result) {
	t.Helper()
	if len(runs) < 2 {
		t.Fatalf("the README runs the demo %d times; it must show the first run and a re-run", len(runs))
	}
	first, second := runs[0], runs[1]
	if !strings.Contains(first.stdout, "ingest: 603 rows read: 600 new samples, 0 already stored, 3 bad rows") {
		t.Errorf("first run does not report 603 rows, 600 new samples and 3 bad rows:\n%s", first.stdout)
	}
	if first.stderr != "" {
		t.Errorf("first run wrote to stderr (logs belong in the job's log file):\n%s", first.stderr)
	}
	if info, err := os.Stat(filepath.Join(dir, ".regen", "demo", "regen.log")); err != nil || info.Size() == 0 {
		t.Errorf("no log in .regen/demo/regen.log: %v", err)
	}
	if !strings.Contains(second.stdout, "ingest: 603 rows in 2 files unchanged since the last ingest, not read again: 0 new samples, 600 already stored, 3 bad rows") || strings.Contains(second.stdout, "STARTING") ||
		!strings.Contains(second.stdout, " demo DONE ") {
		t.Errorf("re-run of the finished demo: want nothing new, no server started and one DONE frame:\n%s", second.stdout)
	}
	out := filepath.Join(dir, "out")
	ex := checkExport(t, out, "demo", want, true)
	wantDead := []deadRow{
		{Partition: "B1_glaive", Origin: ":43"},
		{Partition: "B1_glaive", Origin: ":138", Field: "conversations"},
		{Partition: "B1_glaive", Origin: ":253", Field: "id"},
	}
	checkDeadRows(t, ex.dead, "data/glaive_fc.jsonl", wantDead)
	for _, r := range ex.shareGPT {
		if wantSrc := strings.TrimPrefix(r.ID, r.Partition+"/"); r.SourceID != wantSrc || r.SourceID == "" {
			t.Errorf("sharegpt %s: source_id %q, want %q", r.ID, r.SourceID, wantSrc)
			break
		}
	}

	text := regen(t, dir, "status", "job.yaml")
	if text.code != 0 || !strings.Contains(text.stdout, "job demo: DONE") || strings.Contains(text.stdout, "STARTING") {
		t.Errorf("status after the runs: want exit 0, DONE and no endpoint left STARTING\n%s", text)
	}
	if !strings.Contains(text.stdout, " ingest job: 603 rows") || strings.Contains(text.stdout, "job :") {
		t.Errorf("status's ingest event: want \"ingest job: 603 rows ...\" without a stray space:\n%s", text.stdout)
	}
	if !strings.Contains(text.stdout, "bad source rows (dead letters at ingest): 3") || !strings.Contains(text.stdout, "on average") {
		t.Errorf("status does not show the 3 bad rows and the job's average throughput:\n%s", text.stdout)
	}
	checkDemoPaths(t, dir, first.stdout, text.stdout, ex)
	rep, res := status(t, dir, "job.yaml")
	if res.code != 0 || rep.State != monitor.Done {
		t.Errorf("status --json: exit %d state %s, want 0 DONE", res.code, rep.State)
	}
	// Answers cut at the biggest lane's max_tokens are rejected, not exported.
	if rep.Total.Done+rep.Total.Rejected != 600 || rep.Total.Total != 600 || rep.Total.Done != len(ex.shareGPT) ||
		rep.Total.Rejected != len(ex.rejected) || rep.IngestErrors != 3 {
		t.Errorf("status --json: total %+v, ingest errors %d; want 600 finished (%d done, %d rejected) and 3",
			rep.Total, rep.IngestErrors, len(ex.shareGPT), len(ex.rejected))
	}
	if rep.Average == nil || rep.Average.Samples != 600 || rep.Average.TokensPerSec <= 0 {
		t.Errorf("status --json: average %+v, want the job's 600 samples at a rate above zero", rep.Average)
	}
	if len(rep.Endpoints) != 0 {
		t.Errorf("status --json after a no-op re-run: endpoints %+v, want none", rep.Endpoints)
	}
	checkDemoConversations(t, dir, ex)
	checkDemoStats(t, dir, ex)
}

// checkDemoPaths: run, status, export and show name files relative to the
// job file, whatever the working directory, and no absolute path of the
// job's folder appears (issue 21); the README runs the demo two folders up.
func checkDemoPaths(t *testing.T, dir, runText, statusText string, ex exported) {
	t.Helper()
	root := filepath.Dir(filepath.Dir(dir))
	for _, want := range []string{"regen: job demo, store demo.db, log .regen/demo/regen.log (paths relative to examples/demo/)\n",
		"  out/demo.sharegpt.jsonl\n", "  out/demo.dead.jsonl\n"} {
		if !strings.Contains(runText, want) {
			t.Errorf("the demo run does not print %q:\n%s", want, runText)
		}
	}
	exp := regen(t, root, "export", "examples/demo/job.yaml")
	if exp.code != 0 || !strings.Contains(exp.stdout, "  out/demo.rejected.jsonl\n") || !strings.Contains(exp.stdout, "(paths relative to examples/demo/)") {
		t.Errorf("export two folders up: want out/demo.rejected.jsonl and the folder the paths are relative to:\n%s", exp)
	}
	show := regen(t, dir, "show", "job.yaml", ex.rejected[0].ID)
	if !strings.Contains(show.stdout, "source data/") {
		t.Errorf("show %s: want its source as data/<file>:<line>:\n%s", ex.rejected[0].ID, show)
	}
	dead, err := os.ReadFile(filepath.Join(dir, "out", "demo.dead.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{runText, statusText, exp.stdout, show.stdout, string(dead)} {
		if strings.Contains(text, root) {
			t.Errorf("an absolute path of the job's folder %s in:\n%s", root, text)
		}
	}
	const rejected = "(exported to out/demo.rejected.jsonl with the evidence"
	if !strings.Contains(statusText, rejected) {
		t.Errorf("status run in the job's folder does not say %q:\n%s", rejected, statusText)
	}
	if res := regen(t, root, "status", "examples/demo/job.yaml"); !strings.Contains(res.stdout, rejected) {
		t.Errorf("status run two folders up does not say %q:\n%s", rejected, res.stdout)
	}
}

// TestNoUnshippedCitations: output and docs cite only what ships; the engine
// notes the code was first written from are not in the repository.
func TestNoUnshippedCitations(t *testing.T) {
	bad := "ENGINES" + ".md"
	// What the repository ships, not what a user's runs left in the tree.
	files, err := shippedFiles(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		switch path.Ext(f) {
		case ".go", ".md", ".yaml", ".json", ".txt", ".golden", ".tmpl":
		default:
			continue
		}
		if strings.Contains(f, "node_modules/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), bad) {
			t.Errorf("%s cites %s, which is not in the repository: cite docs/engines.md", f, bad)
		}
	}
}

// demoInput computes, from the demo's input files alone, the sample ids a
// run must produce and the line numbers of the JSONL rows that cannot be
// samples (not JSON, no id, conversations not a list).
func demoInput(t *testing.T, dataDir string) (ids []string, badLines []int) {
	t.Helper()
	f, err := os.Open(filepath.Join(dataDir, "glaive_fc.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var row struct {
			ID            string `json:"id"`
			Conversations []json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil || row.ID == "" || len(row.Conversations) == 0 {
			badLines = append(badLines, n)
			continue
		}
		ids = append(ids, "B1_glaive/"+row.ID)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	type opencode struct {
		ID string `parquet:"id"`
	}
	rows, err := parquet.ReadFile[opencode](filepath.Join(dataDir, "opencode.parquet"))
	if err != nil {
		t.Fatalf("read demo parquet: %v", err)
	}
	for _, r := range rows {
		ids = append(ids, "B2_opencode/"+r.ID)
	}
	return ids, badLines
}

// checkDeadRows checks the ingest dead letters: one per bad row, in source
// order, each with its file:line origin, the field when one field is at
// fault, and a reason.
func checkDeadRows(t *testing.T, got []deadRow, file string, want []deadRow) {
	t.Helper()
	var ingest []deadRow
	for _, d := range got {
		if d.Origin != "" {
			ingest = append(ingest, d)
		}
	}
	if len(ingest) != len(want) {
		t.Errorf("dead letters with an origin: got %d, want %d: %+v", len(ingest), len(want), ingest)
		return
	}
	for i, w := range want {
		if ingest[i].Origin != file+w.Origin {
			t.Errorf("dead letter %d is %s, want %s: bad rows in source order", i, ingest[i].Origin, file+w.Origin)
		}
	}
	for _, w := range want {
		origin := file + w.Origin
		found := false
		for _, d := range ingest {
			if d.Origin != origin {
				continue
			}
			found = true
			if d.Partition != w.Partition || d.Field != w.Field || d.Reason == "" {
				t.Errorf("dead letter %s: partition %q field %q reason %q; want partition %q field %q and a reason",
					origin, d.Partition, d.Field, d.Reason, w.Partition, w.Field)
			}
		}
		if !found {
			t.Errorf("no dead letter with origin %s in %+v", origin, ingest)
		}
	}
}
