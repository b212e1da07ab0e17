package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2EAliasBomb: the job file (nine levels of nine-fold aliases
// under generation.extra, 17.6 GB once expanded) is refused by validate and
// by run with the file, line and field, and run creates no store.
func TestE2EAliasBomb(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("name: bomb\nmodel: m\nendpoints:\n  - url: http://127.0.0.1:1\nsources:\n  - {partition: a, path: a.jsonl, prompt: q}\ngeneration:\n  extra:\n")
	b.WriteString(`    a: &a ["x","x","x","x","x","x","x","x","x"]` + "\n")
	for i, name := range strings.Split("bcdefghi", "") {
		prev := "*" + string("abcdefgh"[i])
		fmt.Fprintf(&b, "    %s: &%s [%s]\n", name, name, strings.TrimSuffix(strings.Repeat(prev+",", 9), ","))
	}
	writeFiles(t, dir, map[string]string{"job.yaml": b.String(), "a.jsonl": `{"q":"hi"}` + "\n"})
	// The aliases of b..e add 74,718 values; f's first alias of e (66,430
	// values, line 14) passes the budget of 100,000.
	const want = "job.yaml:14:12: generation.extra.f[0]: alias *e repeats 66430 values"
	for _, cmd := range []string{"validate", "run"} {
		res := regen(t, dir, cmd, "job.yaml")
		t.Logf("regen %s refused the bomb in %s", cmd, res.dur.Round(time.Millisecond))
		if res.code != 1 || !strings.Contains(res.stderr, want) {
			t.Errorf("regen %s: want exit 1 and %q\n%s", cmd, want, res)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bomb.db")); !os.IsNotExist(err) {
		t.Errorf("run made a store for a refused job file (stat: %v)", err)
	}
}

// writeFiles writes name -> content under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
