package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/monitor"
)

// watchSize is one terminal `regen watch` runs in.
type watchSize struct {
	w, h int
	x    tmux
}

// TestE2EWatchSizes runs the demo job (its simulator slowed to last
// minutes) and `regen watch` in three real terminals (tmux) of 80x24,
// 100x30 and 200x60. Every column of the table and every figure of the
// endpoint line must be on screen whole or deliberately abbreviated, the
// limit reason readable in the endpoints pane, and a tall terminal must
// use its height. Then the runner is SIGKILLed (its simulator dies with
// it) and every view must mark the endpoints as of the runner's death.
func TestE2EWatchSizes(t *testing.T) {
	t.Parallel()
	bin := needTool(t, "tmux", "tmux")
	dir := t.TempDir()
	copyExample(t, "demo", dir)
	jobPath := filepath.Join(dir, "job.yaml")
	src, err := os.ReadFile(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	slow := strings.Replace(string(src), "speed: 40 ", "speed: 2 ", 1)
	if slow == string(src) {
		t.Fatal("the demo job no longer sets speed: 40; adjust the test")
	}
	if err := os.WriteFile(jobPath, []byte(slow), 0o644); err != nil {
		t.Fatal(err)
	}
	runner := startRegen(t, dir, "run", "job.yaml", "--no-export")
	waitJob(t, dir, runner, func(r monitor.Report) bool {
		return r.State == monitor.Running && r.Total.InFlight > 0 && len(r.Endpoints) > 0 && r.Endpoints[0].Load != nil
	})

	var views []watchSize
	for i, sz := range [][2]int{{80, 24}, {100, 30}, {200, 60}} {
		x := tmux{t: t, bin: bin, socket: fmt.Sprintf("regen-watch-sizes-%d-%d", os.Getpid(), i)}
		x.run("new-session", "-d", "-s", "watch", "-x", fmt.Sprint(sz[0]), "-y", fmt.Sprint(sz[1]), "-c", dir, regenBin+" watch job.yaml")
		defer exec.Command(bin, "-L", x.socket, "kill-server").Run()
		views = append(views, watchSize{sz[0], sz[1], x})
	}
	for _, v := range views {
		v.x.waitState("RUNNING", time.Now(), 60*time.Second)
	}
	// A moment for the views to show the endpoint's load and limit.
	rep := waitJob(t, dir, runner, func(r monitor.Report) bool { return r.Endpoints[0].LimitReason != "" })
	time.Sleep(time.Second)
	for _, v := range views {
		checkRunningView(t, v)
	}
	// The limit reason, wrapped, reads whole in the narrowest endpoints pane.
	narrow := views[0]
	narrow.x.run("send-keys", "-t", "watch", "Tab")
	deadline := time.Now().Add(10 * time.Second)
	reason := rep.Endpoints[0].LimitReason
	var pane string
	for time.Now().Before(deadline) {
		pane = narrow.x.screen()
		if strings.Contains(unwrap(pane), firstWords(reason, 6)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(unwrap(pane), firstWords(reason, 6)) {
		t.Errorf("80x24 endpoints pane lacks the limit reason %q:\n%s", reason, pane)
	}
	checkScreenFits(t, narrow, pane)
	narrow.x.run("send-keys", "-t", "watch", "BTab")

	killed := time.Now()
	if err := runner.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	runner.wait(t)
	for _, v := range views {
		checkDeadView(t, v, killed)
	}
}

// checkRunningView: a live job's view, whole at its size.
func checkRunningView(t *testing.T, v watchSize) {
	t.Helper()
	screen := v.x.screen()
	t.Logf("%dx%d running:\n%s", v.w, v.h, screen)
	checkScreenFits(t, v, screen)
	checkTableColumns(t, v, screen)
	checkEndpointLine(t, v, screen, false)
	if !regexp.MustCompile(`tokens/s +[0-9.]+ now \((1m|its first \w+)\), [0-9.]+ over (10m|its first \w+)`).MatchString(screen) {
		t.Errorf("%dx%d: the tokens/s line is not whole:\n%s", v.w, v.h, screen)
	}
	// A tall terminal spends its height on the endpoint's detail (its
	// limit and why, its KV pool) and on the events, all of them here.
	if v.h >= 30 && (!strings.Contains(screen, "last events") || !strings.Contains(screen, "    limit ") ||
		!strings.Contains(screen, "    KV pool ") || strings.Contains(screen, "more lines below")) {
		t.Errorf("%dx%d: spare height not used for the endpoint's detail and the events:\n%s", v.w, v.h, screen)
	}
	if v.h == 60 && !strings.Contains(screen, "endpoint_state") {
		t.Errorf("200x60: the endpoint's state events are not shown:\n%s", screen)
	}
}

// checkDeadView waits for the view to say DEAD after the runner's SIGKILL
// and checks it shows the endpoints, leases and rates as of the death.
func checkDeadView(t *testing.T, v watchSize, killed time.Time) {
	t.Helper()
	took := v.x.waitState("DEAD", killed, 30*time.Second)
	time.Sleep(700 * time.Millisecond) // the next read after DEAD: the view redraws twice a second
	screen := v.x.screen()
	t.Logf("%dx%d DEAD %s after the kill:\n%s", v.w, v.h, took.Round(time.Millisecond), screen)
	checkScreenFits(t, v, screen)
	checkTableColumns(t, v, screen)
	checkEndpointLine(t, v, screen, true)
	if !strings.Contains(unwrap(screen), "endpoints when the runner died at") {
		t.Errorf("%dx%d: the endpoints are not marked as of the runner's death:\n%s", v.w, v.h, screen)
	}
	if regexp.MustCompile(`(?m)^\s*http://\S+\s+READY\s+in flight`).MatchString(screen) {
		t.Errorf("%dx%d: a dead runner's endpoint still reads READY in flight now:\n%s", v.w, v.h, screen)
	}
	if !strings.Contains(screen, "0 now (the runner died)") || !strings.Contains(screen, "requests/s  0.00 now") {
		t.Errorf("%dx%d: the rates do not say nothing runs now:\n%s", v.w, v.h, screen)
	}
	if !regexp.MustCompile(`\(\d+\)\s+\S+\s+\S+\s*$|\(\d+\): leased by the runner that died`).MatchString(screen) {
		t.Errorf("%dx%d: the dead runner's leases read as in flight:\n%s", v.w, v.h, screen)
	}
}

// waitJob polls `regen status --json` until ok holds, and returns that report.
func waitJob(t *testing.T, dir string, runner *proc, ok func(monitor.Report) bool) monitor.Report {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var rep monitor.Report
		res := regen(t, dir, "status", "--json", "job.yaml")
		if json.Unmarshal([]byte(res.stdout), &rep) == nil && ok(rep) {
			return rep
		}
		if runner.exited() {
			t.Fatalf("the runner exited:\n%s", runner.wait(t))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job never reached the state the test waits for:\n%s", res)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkScreenFits: no row is wider than the terminal (tmux would wrap it,
// and the view would scroll).
func checkScreenFits(t *testing.T, v watchSize, screen string) {
	t.Helper()
	rows := strings.Split(strings.TrimRight(screen, "\n"), "\n")
	if len(rows) > v.h {
		t.Errorf("%dx%d: %d rows on screen", v.w, v.h, len(rows))
	}
}

// checkTableColumns: the table header names every column, in full or by
// the abbreviation its legend explains.
func checkTableColumns(t *testing.T, v watchSize, screen string) {
	t.Helper()
	var head string
	for _, l := range strings.Split(screen, "\n") {
		if strings.HasPrefix(l, "partition/lane") {
			head = l
		}
	}
	if head == "" {
		t.Errorf("%dx%d: no table header:\n%s", v.w, v.h, screen)
		return
	}
	for _, c := range []struct{ full, short string }{{"done/total", ""}, {"pending", "pend"}, {"in flight", "infl"}, {"rejected", "rej"}, {"dead", ""}} {
		switch {
		case strings.Contains(head, c.full):
		case c.short != "" && strings.Contains(head, c.short) && strings.Contains(screen, c.short+" = "+c.full):
		default:
			t.Errorf("%dx%d: column %q missing from the header %q", v.w, v.h, c.full, head)
		}
	}
	if !strings.HasSuffix(strings.TrimRight(head, " "), "dead") {
		t.Errorf("%dx%d: the header does not end with its last column: %q", v.w, v.h, head)
	}
}

// checkEndpointLine: the endpoint's in-flight count, limit, KV, queued and
// running are on screen whole (wrapped lines joined).
func checkEndpointLine(t *testing.T, v watchSize, screen string, died bool) {
	t.Helper()
	pat := `http://127\.0\.0\.1:\d+ +(READY|DEGRADED) +in flight \d+ of limit \d+ +KV (\[[█░]+\] +)?\d+% +queued \d+ +running \d+`
	if died {
		pat = `http://127\.0\.0\.1:\d+ +was (READY|DEGRADED) +in flight \d+ of limit \d+ when it died +KV (\[[█░]+\] +)?\d+% +queued \d+ +running \d+`
	}
	if !regexp.MustCompile(pat).MatchString(unwrap(screen)) {
		t.Errorf("%dx%d: the endpoint line is not whole (want /%s/):\n%s", v.w, v.h, pat, screen)
	}
}

// unwrap joins the view's continuation lines (indented) to the line before.
func unwrap(screen string) string {
	return regexp.MustCompile(`\s*\n\s+`).ReplaceAllString(screen, " ")
}

// firstWords is the first n words of s.
func firstWords(s string, n int) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(n, len(f))], " ")
}
