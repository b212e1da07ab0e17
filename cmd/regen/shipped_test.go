package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// repoRoot is the repository's top folder, relative to this package's
// directory (the test's working directory).
const repoRoot = "../.."

// examplesDir is the repository's examples/ folder.
const examplesDir = repoRoot + "/examples"

// copyExample copies examples/<sub> into dst as a fresh clone holds it
// (copyTree's rule): the demo a user ran in their own tree leaves demo.db,
// out/ and .regen/ beside the job, and a test must not start from those.
func copyExample(t *testing.T, sub, dst string) {
	t.Helper()
	copyTree(t, filepath.Join(examplesDir, sub), dst)
}

// shippedFiles lists the files of src a test may copy, as slash paths
// relative to src, sorted. In a git checkout that is what git tracks (and
// is still on disk). Under the repository without git (no git command, an
// unpacked archive) it is every file except what a run leaves behind
// (runLeftover). Elsewhere (a test's own temporary folder) it is every file.
func shippedFiles(src string) ([]string, error) {
	// git fails when there is no git, src is in no checkout, or it refuses
	// the checkout (owned by another user): then the rule without git.
	if files, err := gitTracked(src); err == nil {
		if len(files) == 0 {
			return nil, fmt.Errorf("git tracks no file under %s: git add what the tests copy", src)
		}
		return files, nil
	}
	inRepo, err := underRepo(src)
	if err != nil {
		return nil, err
	}
	return walkFiles(src, inRepo)
}

// gitTracked lists the files under src that git tracks and that exist in
// the work tree (a tracked file deleted on disk is not copied).
func gitTracked(src string) ([]string, error) {
	out, err := exec.Command("git", "-C", src, "ls-files", "-z", "--cached", "--", ".").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", src, err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(src, f)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		files = append(files, f)
	}
	slices.Sort(files)
	return files, nil
}

// walkFiles lists every regular file under src, leaving out what a run
// leaves behind when skipLeftovers is set.
func walkFiles(src string, skipLeftovers bool) ([]string, error) {
	var files []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skipLeftovers && p != src && runLeftover(d.Name(), d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	slices.Sort(files)
	return files, err
}

// runLeftover reports whether a file or folder of that name is something a
// regen run or a build writes beside a job (a store and its WAL, journal
// and lock folder, the output folder, the log folder, logs, a built
// binary), never something the repository ships.
func runLeftover(name string, dir bool) bool {
	if dir {
		return name == "out" || name == ".regen" || name == ".git" || strings.HasSuffix(name, ".locks")
	}
	return strings.HasSuffix(name, ".db") || strings.Contains(name, ".db-") ||
		strings.HasSuffix(name, ".log") || strings.HasSuffix(name, ".test") || name == "regen"
}

// underRepo reports whether src is inside the repository's folder.
func underRepo(src string) (bool, error) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		return false, err
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return false, err
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil {
		return false, nil
	}
	return rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)), nil
}

// copyFiles copies files (slash paths relative to src) into dst.
func copyFiles(src, dst string, files []string) error {
	for _, f := range files {
		from, to := filepath.Join(src, filepath.FromSlash(f)), filepath.Join(dst, filepath.FromSlash(f))
		b, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(dst, 0o755)
}

// gitCheckout makes root a git checkout whose index holds every file in it,
// as a fresh clone's does, and returns those files.
func gitCheckout(t *testing.T, root string) []string {
	t.Helper()
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}} {
		if out, err := exec.Command("git", append([]string{"-C", root}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %s in %s: %v\n%s", args[0], root, err, out)
		}
	}
	files, err := walkFiles(root, false)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(files, func(f string) bool { return strings.HasPrefix(f, ".git/") })
}

// checkCopiesIgnoreRuns is issue 30's acceptance: after the demo ran in a
// clone (root, whose files before the run were shipped), what the tests
// copy out of its examples/ is exactly what the clone shipped, with git and
// without, and a demo started from the copy starts from nothing, as
// TestE2EWatchSizes's must (it copied the finished demo.db and found all 600
// samples done).
func checkCopiesIgnoreRuns(t *testing.T, root string, shipped []string) {
	t.Helper()
	demo := filepath.Join(root, "examples", "demo")
	for _, left := range []string{"demo.db", "demo.db.locks", "out", ".regen"} {
		if _, err := os.Stat(filepath.Join(demo, left)); err != nil {
			t.Fatalf("the demo left no %s to leave out of the copies: %v", left, err)
		}
	}
	var want []string
	for _, f := range shipped {
		if rel, ok := strings.CutPrefix(f, "examples/demo/"); ok {
			want = append(want, rel)
		}
	}
	copied := t.TempDir()
	copyTree(t, demo, copied)
	got, err := walkFiles(copied, false)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("copyTree of the demo folder the demo ran in (-shipped +copied):\n%s", diff)
	}
	noGit, err := walkFiles(demo, true)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, noGit); diff != "" {
		t.Errorf("without git, the files a copy takes from the demo folder (-shipped +taken):\n%s", diff)
	}
	run := startRegen(t, copied, "run", "job.yaml", "--no-export")
	found := run.waitLine("ingest: ")
	_ = run.cmd.Process.Kill()
	res := run.wait(t)
	if !found || !strings.Contains(res.stdout, "ingest: 603 rows read: 600 new samples, 0 already stored") {
		t.Errorf("the demo run from the copy does not start afresh (600 new samples, 0 already stored):\n%s", res)
	}
}

// TestCopyTreeLeavesRunsBehind: copyTree takes from a git checkout only
// the files git tracks, whatever a run left beside them (store, WAL, lock
// folder, output, logs, a file the user made); without git it leaves out
// what a run leaves; from a folder outside the repository that is no
// checkout (a test's own temporary folder) it copies every file.
func TestCopyTreeLeavesRunsBehind(t *testing.T) {
	tracked := []string{"data/a.jsonl", "job.yaml"}
	leftovers := []string{"demo.db", "demo.db-wal", "demo.db-shm", "demo.db.locks/runner", "out/demo.sharegpt.jsonl",
		".regen/demo/regen.log", "run.log"}
	src := t.TempDir()
	write := func(files ...string) {
		for _, f := range files {
			p := filepath.Join(src, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(tracked...)
	if got := gitCheckout(t, src); !slices.Equal(got, tracked) {
		t.Fatalf("checkout holds %q, want %q", got, tracked)
	}
	write(leftovers...)
	write("notes.txt")

	dst := t.TempDir()
	copyTree(t, src, dst)
	if got, err := walkFiles(dst, false); err != nil || !slices.Equal(got, tracked) {
		t.Errorf("copy of a checkout holds %q (%v), want only the tracked %q", got, err, tracked)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "data", "a.jsonl")); err != nil || string(b) != "data/a.jsonl" {
		t.Errorf("copied data/a.jsonl: %q, %v", b, err)
	}
	want := append(slices.Clone(tracked), "notes.txt")
	slices.Sort(want)
	if got, err := walkFiles(src, true); err != nil || !slices.Equal(got, want) {
		t.Errorf("without git, a copy takes %q (%v), want %q", got, err, want)
	}

	// The rule without git applies under the repository only.
	if in, err := underRepo(filepath.Join(examplesDir, "demo")); err != nil || !in {
		t.Errorf("examples/demo is not under the repository: %v", err)
	}
	if in, err := underRepo(src); err != nil || in {
		t.Errorf("a temporary folder is under the repository: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(src, ".git")); err != nil {
		t.Fatal(err)
	}
	all := t.TempDir()
	copyTree(t, src, all)
	want = append(want, leftovers...)
	slices.Sort(want)
	if got, err := walkFiles(all, false); err != nil || !slices.Equal(got, want) {
		t.Errorf("copy of a temporary folder holds %q (%v), want all of %q", got, err, want)
	}
}
