package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"
	_ "modernc.org/sqlite" // read-only look into the job's store

	"github.com/regen-dev/regen/internal/export"
	"github.com/regen-dev/regen/internal/monitor"
)

// hangGuard bounds one regen subprocess so a hang fails the test with the
// process's output instead of stalling the whole package. It is a safety
// net far above any normal duration, not a timing assertion.
const hangGuard = 4 * time.Minute

// result is a finished regen subprocess.
type result struct {
	args   []string
	stdout string
	stderr string
	code   int
	dur    time.Duration
	maxRSS int64 // peak resident memory in bytes (from the kernel's rusage)
}

func (r result) String() string {
	return fmt.Sprintf("regen %s: exit %d after %s\nstdout:\n%s\nstderr:\n%s",
		strings.Join(r.args, " "), r.code, r.dur.Round(time.Millisecond), r.stdout, r.stderr)
}

// regen runs the binary in dir to completion.
func regen(t *testing.T, dir string, args ...string) result {
	t.Helper()
	p := startRegen(t, dir, args...)
	return p.wait(t)
}

// regenEnv is regen with extra environment variables.
func regenEnv(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	return startRegenEnv(t, dir, env, args...).wait(t)
}

// proc is a running regen subprocess whose stdout lines the test can wait for.
type proc struct {
	cmd     *exec.Cmd
	args    []string
	start   time.Time
	stderr  lockedBuffer
	readEnd chan struct{} // closed when stdout hit EOF

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on every new line and at EOF

	waitOnce sync.Once
	res      result
	guard    *time.Timer
}

func startRegen(t *testing.T, dir string, args ...string) *proc {
	t.Helper()
	return startRegenEnv(t, dir, nil, args...)
}

// startRegenEnv is startRegen with extra environment variables (KEY=value).
func startRegenEnv(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	return startRegenVia(t, nil, dir, env, args...)
}

// startRegenVia is startRegenEnv with regen run through a wrapper command
// that execs it (e.g. ip netns exec NAME), so the process is regen's own.
func startRegenVia(t *testing.T, wrapper []string, dir string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(regenBin, args...)
	if len(wrapper) > 0 {
		cmd = exec.Command(wrapper[0], append(append(wrapper[1:len(wrapper):len(wrapper)], regenBin), args...)...)
	}
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "NO_COLOR=1"), env...)
	p := &proc{cmd: cmd, args: args, readEnd: make(chan struct{}), changed: make(chan struct{})}
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start regen %s: %v", strings.Join(args, " "), err)
	}
	p.guard = time.AfterFunc(hangGuard, func() { _ = cmd.Process.Signal(syscall.SIGQUIT) })
	t.Cleanup(func() {
		// A test that failed half way must not leave its runner behind.
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			p.wait(t)
		}
	})
	go p.read(out)
	return p
}

func (p *proc) read(r io.Reader) {
	defer close(p.readEnd)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, r)
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// waitLine blocks until stdout has a line starting with prefix (true) or
// the process closed stdout without one (false).
func (p *proc) waitLine(prefix string) bool {
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if strings.HasPrefix(l, prefix) {
				p.mu.Unlock()
				return true
			}
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-p.readEnd:
			p.mu.Lock()
			found := slices.ContainsFunc(p.lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
			p.mu.Unlock()
			return found
		case <-ch:
		}
	}
}

// hasLine reports whether stdout has had a line starting with prefix.
func (p *proc) hasLine(prefix string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

func (p *proc) stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// exited reports whether the process has closed its stdout (it is exiting).
func (p *proc) exited() bool {
	select {
	case <-p.readEnd:
		return true
	default:
		return false
	}
}

// wait reaps the process; a run that hit hangGuard fails the test.
func (p *proc) wait(t *testing.T) result {
	t.Helper()
	p.waitOnce.Do(func() {
		<-p.readEnd
		err := p.cmd.Wait()
		p.guard.Stop()
		p.res = result{args: p.args, stdout: p.stdout(), stderr: p.stderr.String(), dur: time.Since(p.start)}
		p.res.code = p.cmd.ProcessState.ExitCode()
		if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			p.res.maxRSS = ru.Maxrss << 10 // KiB on Linux
		}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Errorf("wait for regen %s: %v", strings.Join(p.args, " "), err)
		}
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGQUIT {
			t.Fatalf("regen ran longer than %s (hang); goroutine dump in stderr:\n%s", hangGuard, p.res)
		}
	})
	return p.res
}

// killed reports whether the process ended by SIGKILL.
func (p *proc) killed() bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// copyTree copies the directory src into dst, as a fresh clone holds it
// when src is in the repository: only what git tracks (shippedFiles), never
// the store, output or logs a user's own run left beside a job (issue 30).
// Every test that copies examples or testdata goes through here.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	files, err := shippedFiles(src)
	if err == nil {
		err = copyFiles(src, dst, files)
	}
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}

// readJSONL reads a JSONL file and fails the test on any line that is not
// one complete JSON object (a torn line) or a file not ending in a newline.
func readJSONL(t *testing.T, path string) []json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read output: %v", err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Errorf("%s: last line has no newline (torn write): %q", path, tail(b, 80))
	}
	var out []json.RawMessage
	for i, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 {
			if i != bytes.Count(b, []byte("\n")) {
				t.Errorf("%s:%d: empty line", path, i+1)
			}
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(line, &obj); err != nil {
			t.Errorf("%s:%d: not one JSON object (%v): %q", path, i+1, err, tail(line, 80))
			continue
		}
		out = append(out, json.RawMessage(line))
	}
	return out
}

func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return "..." + string(b[len(b)-n:])
}

// genTurn is the generated assistant message as both JSONL formats write it.
type genTurn struct {
	Role      string            `json:"role"`
	Content   *string           `json:"content"`
	ToolCalls []json.RawMessage `json:"tool_calls"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type sharegptRow struct {
	ID            string    `json:"id"`
	SourceID      string    `json:"source_id"`
	Conversations []genTurn `json:"conversations"`
	Partition     string    `json:"partition"`
	Lane          string    `json:"lane"`
	FinishReason  string    `json:"finish_reason"`
	Usage         usage     `json:"usage"`
	Attempts      int       `json:"attempts"`
}

type batchRow struct {
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int `json:"status_code"`
		Body       struct {
			Choices []struct {
				Message      genTurn `json:"message"`
				FinishReason string  `json:"finish_reason"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		} `json:"body"`
	} `json:"response"`
	Error json.RawMessage `json:"error"`
}

// deadRow is one line of <name>.dead.jsonl.
type deadRow struct {
	ID        string `json:"id"`
	Partition string `json:"partition"`
	Origin    string `json:"origin"`
	Field     string `json:"field"`
	Reason    string `json:"reason"`
}

// rejectedRow is one line of <name>.rejected.jsonl.
type rejectedRow struct {
	ID       string `json:"id"`
	Rule     string `json:"rule"`
	Evidence string `json:"evidence"`
	Turn     int    `json:"turn"`
}

// exported is what one export holds, as the checks found it.
type exported struct {
	shareGPT  []sharegptRow
	rejected  []rejectedRow
	dead      []deadRow
	parquetN  int
	truncated int
	lanes     map[string]int // done samples per lane (with metadata: full)
}

// checkExport verifies the output files of job name in outDir: every line
// is whole JSON, every id of want appears exactly once, either accepted in
// the ShareGPT and OpenAI-batch files (and the Parquet file, when written)
// or rejected in the rejected file and the batch errors file, and nothing
// else does; every ShareGPT record meets the training-data contract, and
// every result is intact.
func checkExport(t *testing.T, outDir, name string, want []string, withParquet bool) exported {
	t.Helper()
	var ex exported
	ex.lanes = map[string]int{}
	path := func(suffix string) string { return filepath.Join(outDir, name+suffix) }

	var sgIDs []string
	// Done samples: the training file and the truncated answers beside it
	// (output.train_truncated off), which must not be in the training file.
	lines := readJSONL(t, export.TrainingFile(outDir, name, export.FormatShareGPT))
	for _, raw := range lines {
		if bytes.Contains(raw, []byte(`"truncated":true`)) {
			t.Errorf("a truncated answer in the training file: %s", tail(raw, 200))
		}
	}
	if _, err := os.Stat(path(".sharegpt.truncated.jsonl")); err == nil {
		lines = append(lines, readJSONL(t, path(".sharegpt.truncated.jsonl"))...)
	}
	for _, raw := range lines {
		if err := export.CheckShareGPTLine(raw); err != nil {
			t.Errorf("sharegpt line breaks the training-data contract: %v: %s", err, tail(raw, 300))
		}
		var r sharegptRow
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Errorf("sharegpt line %q: %v", tail(raw, 80), err)
			continue
		}
		sgIDs = append(sgIDs, r.ID)
		ex.shareGPT = append(ex.shareGPT, r)
		ex.lanes[r.Lane]++
		if r.FinishReason == "length" {
			ex.truncated++
		}
		if len(r.Conversations) < 2 {
			t.Errorf("sharegpt %s: %d turns, want the prompt and the answer", r.ID, len(r.Conversations))
			continue
		}
		if r.FinishReason != "" { // run details are there with metadata: full
			checkTurn(t, "sharegpt "+r.ID, r.Conversations[len(r.Conversations)-1], r.FinishReason, r.Usage)
		}
	}
	var rejIDs []string
	for _, raw := range readJSONL(t, path(".rejected.jsonl")) {
		var r rejectedRow
		if err := json.Unmarshal(raw, &r); err != nil || r.Rule == "" || r.Evidence == "" {
			t.Errorf("rejected line without rule and evidence (%v): %s", err, tail(raw, 200))
			continue
		}
		rejIDs = append(rejIDs, r.ID)
		ex.rejected = append(ex.rejected, r)
	}
	if inter := intersect(sgIDs, rejIDs); len(inter) > 0 {
		t.Errorf("samples both accepted and rejected: %v", first(inter, 10))
	}
	checkIDs(t, "sharegpt+rejected", append(slices.Clone(sgIDs), rejIDs...), want)
	doneIDs := idSet(sgIDs)

	var batchIDs []string
	for _, raw := range readJSONL(t, path(".openai-batch.jsonl")) {
		var r batchRow
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Errorf("openai-batch line %q: %v", tail(raw, 80), err)
			continue
		}
		batchIDs = append(batchIDs, r.CustomID)
		if r.Response == nil || r.Response.StatusCode != 200 || len(r.Response.Body.Choices) != 1 || (len(r.Error) > 0 && string(r.Error) != "null") {
			t.Errorf("openai-batch %s: want a 200 response with one choice and no error, got %s", r.CustomID, tail(raw, 200))
			continue
		}
		c := r.Response.Body.Choices[0]
		checkTurn(t, "openai-batch "+r.CustomID, c.Message, c.FinishReason, r.Response.Body.Usage)
	}
	checkIDs(t, "openai-batch", batchIDs, doneIDs)

	var errRejected []string
	for _, raw := range readJSONL(t, path(".errors.jsonl")) {
		var r struct {
			CustomID string `json:"custom_id"`
			Error    struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &r) == nil && r.Error.Code == export.CodeRejected {
			errRejected = append(errRejected, r.CustomID)
		}
	}
	if diff := diffSets(rejIDs, errRejected); diff != "" {
		t.Errorf("rejected ids in the batch errors file differ from rejected.jsonl (-rejected +errors):\n%s", diff)
	}
	for _, raw := range readJSONL(t, path(".dead.jsonl")) {
		var d deadRow
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Errorf("dead line %q: %v", tail(raw, 80), err)
			continue
		}
		ex.dead = append(ex.dead, d)
	}

	if withParquet {
		rows, err := parquet.ReadFile[export.ParquetRow](export.TrainingFile(outDir, name, export.FormatParquet))
		if err != nil {
			t.Errorf("read parquet export: %v", err)
		}
		if _, err := os.Stat(path(".truncated.parquet")); err == nil {
			trunc, err := parquet.ReadFile[export.ParquetRow](path(".truncated.parquet"))
			if err != nil {
				t.Errorf("read the truncated parquet file: %v", err)
			}
			rows = append(rows, trunc...)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.ID)
			if n := len(r.Conversations); n == 0 || r.Conversations[n-1].Role != "assistant" ||
				r.Conversations[n-1].Content == "" && r.Conversations[n-1].ToolCalls == nil {
				t.Errorf("parquet %s: the conversation does not end with an answer or a tool call", r.ID)
			}
		}
		checkIDs(t, "parquet", ids, doneIDs)
		ex.parquetN = len(rows)
	}

	// No temporary file of an interrupted export may be left as a result.
	entries, _ := os.ReadDir(outDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Logf("left in %s: %s (a temporary file of a killed export)", outDir, e.Name())
		}
	}
	return ex
}

// checkTurn checks that one generated answer is intact.
func checkTurn(t *testing.T, what string, m genTurn, finish string, u usage) {
	t.Helper()
	if m.Role != "assistant" {
		t.Errorf("%s: last turn role %q, want assistant", what, m.Role)
	}
	if (m.Content == nil || *m.Content == "") && len(m.ToolCalls) == 0 {
		t.Errorf("%s: empty answer (no content, no tool calls)", what)
	}
	if finish == "" {
		t.Errorf("%s: no finish_reason", what)
	}
	if u.CompletionTokens <= 0 {
		t.Errorf("%s: usage.completion_tokens = %d, want > 0", what, u.CompletionTokens)
	}
}

// checkIDs reports lost, duplicated and unexpected ids of got against want.
func checkIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	var dup, lost, extra []string
	wantSet := map[string]bool{}
	for _, id := range want {
		wantSet[id] = true
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id, n := range seen {
		if n > 1 {
			dup = append(dup, fmt.Sprintf("%s x%d", id, n))
		}
		if !wantSet[id] {
			extra = append(extra, id)
		}
	}
	sort.Strings(dup)
	sort.Strings(extra)
	if len(lost)+len(dup)+len(extra) > 0 {
		t.Errorf("%s: %d rows for %d wanted ids: %d lost %v, %d duplicated %v, %d unexpected %v",
			what, len(got), len(want), len(lost), first(lost, 10), len(dup), first(dup, 10), len(extra), first(extra, 10))
	}
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// idSet returns the sorted distinct ids.
func idSet(ids []string) []string {
	out := slices.Clone(ids)
	sort.Strings(out)
	return slices.Compact(out)
}

// status runs `regen status --json` and decodes the report.
func status(t *testing.T, dir, jobFile string) (monitor.Report, result) {
	t.Helper()
	res := regen(t, dir, "status", "--json", jobFile)
	var r monitor.Report
	if err := json.Unmarshal([]byte(res.stdout), &r); err != nil {
		t.Fatalf("status --json output does not parse: %v\n%s", err, res)
	}
	return r, res
}

// storeRow is one sample as the SQLite store holds it.
type storeRow struct {
	ID       string
	State    string
	Lane     string
	Attempts int
}

// openStoreRO opens a job's SQLite store read-only, beside a running runner
// (WAL readers never block its writes).
func openStoreRO(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// storeCounts returns the number of samples per state.
func storeCounts(ctx context.Context, db *sql.DB) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT state, count(*) FROM samples GROUP BY state`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// checkRowsOnce checks a store's rows: total samples and total results,
// every sample done with one attempt (kills, restarts and outages spend
// none); the first ten exceptions are named.
func checkRowsOnce(t *testing.T, rows []storeRow, results, total int) {
	t.Helper()
	if len(rows) != total || results != total {
		t.Errorf("store: %d samples and %d results, want %d of each", len(rows), results, total)
	}
	bad := 0
	for _, r := range rows {
		if r.State != "done" || r.Attempts != 1 {
			bad++
			if bad <= 10 {
				t.Errorf("store sample %s: state %s attempts %d, want done with 1 attempt", r.ID, r.State, r.Attempts)
			}
		}
	}
	if bad > 0 {
		t.Errorf("store: %d samples not done in exactly one attempt", bad)
	}
}

// storeRows reads every sample's state and attempts, and the number of
// stored results.
func storeRows(t *testing.T, path string) (rows []storeRow, results int) {
	t.Helper()
	db := openStoreRO(t, path)
	q, err := db.Query(`SELECT id, state, lane, attempts FROM samples ORDER BY id`)
	if err != nil {
		t.Fatalf("read store: %v", err)
	}
	defer q.Close()
	for q.Next() {
		var r storeRow
		if err := q.Scan(&r.ID, &r.State, &r.Lane, &r.Attempts); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM results`).Scan(&results); err != nil {
		t.Fatalf("count results: %v", err)
	}
	return rows, results
}

// intersect returns the ids in both a and b.
func intersect(a, b []string) []string {
	in := map[string]bool{}
	for _, id := range a {
		in[id] = true
	}
	var out []string
	for _, id := range b {
		if in[id] {
			out = append(out, id)
		}
	}
	return out
}

// diffSets is cmp.Diff over sorted distinct ids.
func diffSets(a, b []string) string { return cmp.Diff(idSet(a), idSet(b)) }

// chaosRNG is a random source for a fault test's choices, seeded from the
// clock or from REGEN_CHAOS_SEED to replay a run; stream tells tests apart.
func chaosRNG(t *testing.T, stream uint64) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REGEN_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("REGEN_CHAOS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("chaos seed %d (rerun with REGEN_CHAOS_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, stream))
}

// doneLines are the ShareGPT lines of every done sample of job name in
// outDir: the training file's and the truncated answers' beside it.
func doneLines(t *testing.T, outDir, name string) []json.RawMessage {
	t.Helper()
	lines := readJSONL(t, export.TrainingFile(outDir, name, export.FormatShareGPT))
	trunc := filepath.Join(outDir, name+".sharegpt.truncated.jsonl")
	if _, err := os.Stat(trunc); err == nil {
		lines = append(lines, readJSONL(t, trunc)...)
	}
	return lines
}

// readManifest reads the manifest of the export of name in dir.
func readManifest(t *testing.T, dir, name string) export.Manifest {
	t.Helper()
	path := export.ManifestPath(dir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m export.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}
