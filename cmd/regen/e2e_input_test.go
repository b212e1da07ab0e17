package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EAliasBombByBytes: the job file (a 1 MiB string anchored in
// generation.extra and 3,000 aliases of it: 1 MB written, 3 GB expanded,
// which validate once printed as ok on its way to 23 GB of memory) is
// refused by validate and run with file:line, field and the byte figure.
func TestE2EAliasBombByBytes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("name: bomb\nmodel: m\nendpoints:\n  - url: http://127.0.0.1:1\nsources:\n  - {partition: a, path: a.jsonl, prompt: q}\ngeneration:\n  extra:\n")
	fmt.Fprintf(&b, "    s: &s \"%s\"\n    l:\n", strings.Repeat("x", 1<<20))
	b.WriteString(strings.Repeat("      - *s\n", 3000))
	writeFiles(t, dir, map[string]string{"job.yaml": b.String(), "a.jsonl": `{"q":"hi"}` + "\n"})
	// Line 9 anchors s, line 10 opens l; its fifth alias (line 15) takes
	// the expanded text to 5 MiB.
	const want = "job.yaml:15:9: generation.extra.l[4]: alias *s repeats 1048576 bytes, which takes the file's aliases past 4194304 bytes (4 MiB)"
	for _, cmd := range []string{"validate", "run"} {
		res := regen(t, dir, cmd, "job.yaml")
		t.Logf("regen %s refused the %d-byte bomb in %s, peak RSS %d MiB", cmd, b.Len(), res.dur.Round(time.Millisecond), res.maxRSS>>20)
		if res.code != 1 || !strings.Contains(res.stderr, want) {
			t.Errorf("regen %s: want exit 1 and %q\n%s", cmd, want, res.stderr[:min(len(res.stderr), 2000)])
		}
		if len(res.stdout)+len(res.stderr) > 4096 {
			t.Errorf("regen %s printed %d bytes for a refused file, want a few lines", cmd, len(res.stdout)+len(res.stderr))
		}
		if res.maxRSS > 512<<20 {
			t.Errorf("regen %s peaked at %d MiB of RSS, want far less than the 3 GB the aliases stand for", cmd, res.maxRSS>>20)
		}
	}
}

// TestE2EValidateSIGTERM: validate reading a source that never delivers
// (a named pipe nobody writes) ends at once on SIGTERM, as on SIGINT:
// it has nothing to drain.
func TestE2EValidateSIGTERM(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"job.yaml": "name: slow\nmodel: m\nendpoints:\n  - url: http://127.0.0.1:1\nsources:\n  - {partition: a, path: a.jsonl, prompt: q}\n"})
			if err := syscall.Mkfifo(filepath.Join(dir, "a.jsonl"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := startRegen(t, dir, "validate", "job.yaml")
			// Let it reach the pipe (opening it blocks for ever); an earlier
			// signal is obeyed the same way, so the wait is not a race.
			time.Sleep(500 * time.Millisecond)
			if p.exited() {
				t.Fatalf("validate ended before the signal:\n%s", p.wait(t))
			}
			sent := time.Now()
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			res := p.wait(t)
			t.Logf("validate ended %s after %s (exit %d)", time.Since(sent).Round(time.Millisecond), sig, res.code)
			if res.code != 130 || !strings.Contains(res.stderr, "interrupted") {
				t.Errorf("want exit 130 saying it was interrupted\n%s", res)
			}
		})
	}
}

// TestE2EValidateClipsValues: a job whose generation.extra holds a 1 MiB
// string (and a source a 200-character path away) validates, and no line
// validate prints is longer than a few hundred bytes: long values are cut
// with a marker, the path shown whole.
func TestE2EValidateClipsValues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	long := strings.Repeat("y", 1<<20)
	writeFiles(t, dir, map[string]string{
		"job.yaml": "name: long\nmodel: m\nendpoints:\n  - url: http://127.0.0.1:1\nsources:\n  - {partition: a, path: a.jsonl, prompt: q}\n" +
			"  - {partition: b, path: \"" + strings.Repeat("d/", 100) + "b.jsonl\", prompt: q}\ngeneration:\n  extra:\n    note: \"" + long + "\"\n",
		"a.jsonl": `{"q":"hi"}` + "\n",
	})
	if err := os.MkdirAll(filepath.Join(dir, strings.Repeat("d/", 100)), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{strings.Repeat("d/", 100) + "b.jsonl": `{"q":"hi"}` + "\n"})
	res := regen(t, dir, "validate", "job.yaml")
	if res.code != 0 || !strings.Contains(res.stdout, "more bytes]") {
		t.Fatalf("want ok with the long value clipped\n%s", res.stdout[:min(len(res.stdout), 2000)])
	}
	if !strings.Contains(res.stdout, strings.Repeat("d/", 100)+"b.jsonl") {
		t.Errorf("the 207-byte path is not shown whole:\n%s", res.stdout[:min(len(res.stdout), 2000)])
	}
	for _, line := range strings.Split(res.stdout, "\n") {
		if len(line) > 400 {
			t.Errorf("validate printed a %d-byte line: %.200s...", len(line), line)
		}
	}
}

// TestE2ERunNoSampleExits1: a source mapped with prompt: on a message-list
// column ingests no sample (every row a bad-row dead letter); the run says
// so and exits 1 instead of calling empty training files a success.
func TestE2ERunNoSampleExits1(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var rows strings.Builder
	for i := range 5 {
		fmt.Fprintf(&rows, `{"messages":[{"role":"user","content":"hi %d"}]}`+"\n", i)
	}
	writeFiles(t, dir, map[string]string{
		"job.yaml": "name: none\nmodel: m\nendpoints:\n  - url: http://127.0.0.1:1\nsources:\n  - {partition: a, path: a.jsonl, prompt: messages}\n",
		"a.jsonl":  rows.String(),
	})
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 1 {
		t.Fatalf("a run with no sample: exit %d, want 1\n%s", res.code, res)
	}
	for _, want := range []string{"0 samples", "5 bad source rows", "job has no sample: all 5 source rows read are bad", "training files are empty"} {
		if !strings.Contains(res.stdout+res.stderr, want) {
			t.Errorf("output lacks %q\n%s", want, res)
		}
	}
}

// TestE2EHangupDrains: SIGHUP (a dropped SSH session) stops a run the way
// SIGTERM does: the requests in flight finish and are stored, the samples
// not yet sent stay pending, and the run exits 130 as interrupted (it used
// to die at once of the signal, exit 129, with nothing drained). Started
// under nohup, the run ignores SIGHUP and finishes the job.
func TestE2EHangupDrains(t *testing.T) {
	t.Parallel()
	const rows, lane, first = 40, 16, 8
	for _, nohup := range []bool{false, true} {
		t.Run(map[bool]string{false: "hangup", true: "nohup"}[nohup], func(t *testing.T) {
			srv := startAnswerServer(t, "The answer is four.")
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"job.yaml": ownJob(srv.url, lane)})
			writePrompts(t, filepath.Join(dir, "prompts.jsonl"), rows)
			srv.holdAfter(first) // the first answers come at once, the rest wait
			var wrapper []string
			if nohup {
				wrapper = []string{"nohup"}
			}
			p := startRegenVia(t, wrapper, dir, nil, "run", "--drain-timeout", "1m", "job.yaml")
			db := openStoreRO(t, filepath.Join(dir, "own.db"))
			for {
				c, err := storeCounts(context.Background(), db)
				if err == nil && c["done"] >= first && srv.inFlight.Load() > 0 {
					break
				}
				if p.exited() {
					t.Fatalf("run ended before requests were held:\n%s", p.wait(t))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			if !nohup {
				for !strings.Contains(p.stderr.String(), "draining") {
					if p.exited() {
						t.Fatalf("run ended without draining:\n%s", p.wait(t))
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			srv.release()
			res := p.wait(t)
			if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Fatalf("run died of %s, want a drain\n%s", ws.Signal(), res)
			}
			c, err := storeCounts(context.Background(), db)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("after SIGHUP: exit %d, %v", res.code, c)
			if nohup {
				if res.code != 0 || c["done"] != rows {
					t.Errorf("under nohup: exit %d with %v; want exit 0 and all %d done\n%s", res.code, c, rows, res)
				}
				return
			}
			// Done past the first answers: the held requests were answered
			// after the signal and stored, not cut; the rest wait unspent.
			if res.code != 130 || c["done"] <= first || c["done"]+c["pending"] != rows || c["done"] == rows {
				t.Errorf("exit %d with %v; want exit 130, more than %d done (the drained ones) and the rest pending\n%s", res.code, c, first, res)
			}
		})
	}
}

// TestE2ERunMissingSource: run refuses a source path that matches no file
// with the job file's line and field, as validate does, before it makes a
// store.
func TestE2ERunMissingSource(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ path, want string }{
		{"missing.jsonl", "job.yaml:7: sources[1].path: source b: stat missing.jsonl: no such file or directory"},
		{"data/*.jsonl", "job.yaml:7: sources[1].path: source b path data/*.jsonl: no files match"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{
				"job.yaml": "name: miss\nmodel: m\nendpoints:\n  - url: http://127.0.0.1:1\nsources:\n  - {partition: a, path: a.jsonl, prompt: q}\n  - {partition: b, path: \"" + tt.path + "\", prompt: q}\n",
				"a.jsonl":  `{"q":"hi"}` + "\n",
			})
			for _, cmd := range []string{"validate", "run"} {
				if res := regen(t, dir, cmd, "job.yaml"); res.code != 1 || !strings.Contains(res.stderr, tt.want) {
					t.Errorf("regen %s: want exit 1 and %q\n%s", cmd, tt.want, res)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "miss.db")); !os.IsNotExist(err) {
				t.Errorf("run made a store for a job whose source is missing (stat: %v)", err)
			}
		})
	}
}

// TestE2EInvalidTextDeadLettered: rows whose text is not valid Unicode (a
// Latin-1 byte, a lone \ud800) are dead letters with file:line and the
// byte, not prompts sent with U+FFFD in them; the good row is answered and
// no exported or sent text holds U+FFFD.
func TestE2EInvalidTextDeadLettered(t *testing.T) {
	t.Parallel()
	srv := startAnswerServer(t, "The answer is four.")
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"job.yaml": ownJob(srv.url, 4),
		"prompts.jsonl": `{"id": "q0", "question": "fine"}` + "\n" +
			"{\"id\": \"q1\", \"question\": \"caf\xe9\"}\n" +
			`{"id": "q2", "question": "x\ud800y"}` + "\n",
	})
	res := regen(t, dir, "run", "job.yaml")
	if res.code != 0 || !strings.Contains(res.stdout, "1 done") || !strings.Contains(res.stdout, "2 bad source rows") {
		t.Fatalf("want exit 0, 1 done, 2 bad source rows\n%s", res)
	}
	dead := map[string]string{}
	for _, raw := range readJSONL(t, filepath.Join(dir, "out", "own.dead.jsonl")) {
		var d deadRow
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		dead[d.Origin] = d.Reason
	}
	for origin, want := range map[string]string{
		"prompts.jsonl:2": "invalid UTF-8 at byte 30 (0xe9)",
		"prompts.jsonl:3": `lone UTF-16 surrogate \ud800 at byte 28`,
	} {
		if !strings.HasPrefix(dead[origin], want) {
			t.Errorf("dead letter at %s = %q, want %q (all: %v)", origin, dead[origin], want, dead)
		}
	}
	out, err := os.ReadFile(filepath.Join(dir, "out", "own.sharegpt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(string(out), '\uFFFD') {
		t.Errorf("the export holds U+FFFD:\n%s", out)
	}
}
