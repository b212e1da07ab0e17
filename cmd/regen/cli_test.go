package main

import (
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestMissingArgument: a command run without its job file says what is
// missing and how to call it, not an argument count.
func TestMissingArgument(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status"}, "regen status: missing job file (usage: regen status JOB.yaml)\n"},
		{[]string{"run"}, "regen run: missing job file (usage: regen run JOB.yaml)\n"},
		{[]string{"validate"}, "regen validate: missing job file (usage: regen validate JOB.yaml)\n"},
		{[]string{"export"}, "regen export: missing job file (usage: regen export JOB.yaml)\n"},
		{[]string{"stats"}, "regen stats: missing job file (usage: regen stats JOB.yaml [--json])\n"},
		{[]string{"requeue"}, "regen requeue: missing job file (usage: regen requeue JOB.yaml [--reason TEXT | --rejected [--rule R]])\n"},
		{[]string{"show", "a.yaml"}, "regen show: want a job file and a sample id, got 1 arguments (usage: regen show JOB.yaml ID [--json])\n"},
		{[]string{"status", "a.yaml", "b.yaml"}, "regen status: one job file at a time, got 2 arguments: a.yaml b.yaml (usage: regen status JOB.yaml)\n"},
	} {
		res := regen(t, t.TempDir(), tc.args...)
		if res.code != 1 || res.stderr != tc.want || res.stdout != "" {
			t.Errorf("regen %s: exit %d, stdout %q, stderr %q; want exit 1 and %q", strings.Join(tc.args, " "), res.code, res.stdout, res.stderr, tc.want)
		}
	}
}

// TestVersion: --version and version print the same line, with the commit
// the go command stamped into the binary (the checkout's HEAD when the
// test runs in one).
func TestVersion(t *testing.T) {
	flag := regen(t, t.TempDir(), "--version")
	cmd := regen(t, t.TempDir(), "version")
	if flag.code != 0 || cmd.code != 0 || flag.stdout != cmd.stdout || !strings.HasPrefix(flag.stdout, "regen dev, ") {
		t.Fatalf("regen --version and regen version differ or fail:\n%s\n%s", flag, cmd)
	}
	out, err := exec.Command(goTool(), "version", "-m", regenBin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var rev string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs.revision=") {
			rev = strings.TrimPrefix(f[1], "vcs.revision=")
		}
	}
	if rev == "" {
		// A git worktree or a tree without git: the go command stamps nothing.
		if !strings.Contains(flag.stdout, "no commit recorded") {
			t.Errorf("binary without a VCS stamp: %q does not say so", flag.stdout)
		}
		return
	}
	if !strings.Contains(flag.stdout, "commit "+rev[:12]) {
		t.Errorf("version %q does not name the stamped commit %s", flag.stdout, rev[:12])
	}
	if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil && strings.TrimSpace(string(head)) != rev {
		t.Errorf("binary stamped with %s, checkout HEAD is %s", rev, head)
	}
}

func TestDescribeBuild(t *testing.T) {
	goVer := " " + runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name    string
		bi      debug.BuildInfo
		ldflags string
		want    string
	}{
		{"go build in a clone", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "431189a1b2c3d4e5f6"}, {Key: "vcs.time", Value: "2026-12-03T07:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"dev", "dev, commit 431189a1b2c3+modified (2026-12-03T07:00:00Z), go1.26.8" + goVer},
		{"go build in a clone, go 1.24+ pseudo-version", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261203100708-a35d226821c2+dirty"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "a35d226821c2ffeeddcc"}, {Key: "vcs.time", Value: "2026-12-03T10:07:08Z"}, {Key: "vcs.modified", Value: "true"}}},
			"dev", "dev, commit a35d226821c2+modified (2026-12-03T10:07:08Z), go1.26.8" + goVer},
		{"go build of a tagged commit", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.4.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "a35d226821c2ffeeddcc"}, {Key: "vcs.time", Value: "2026-12-03T10:07:08Z"}}},
			"dev", "v0.4.0, commit a35d226821c2 (2026-12-03T10:07:08Z), go1.26.8" + goVer},
		{"go run", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			"dev", "dev, no commit recorded (built by go run or without VCS stamping), go1.26.8" + goVer},
		{"go install @version", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}},
			"dev", "v0.3.0, no commit recorded (built by go run or without VCS stamping), go1.26.8" + goVer},
		{"release ldflags", debug.BuildInfo{GoVersion: "go1.26.8", Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}},
			"1.0.0", "1.0.0, commit abc, go1.26.8" + goVer},
	} {
		if got := describeBuild(&tc.bi, tc.ldflags); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
