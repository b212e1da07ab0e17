package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// regenBin is the regen binary the end-to-end tests run as real
// subprocesses; TestMain builds it once per test binary. It is built without
// -race even under `go test -race`: the subprocesses are the system under
// test, the race detector covers the packages' own tests.
var regenBin string

// e2eParallel is how many of this package's parallel tests run at once
// when go test is given no -parallel (whose default, GOMAXPROCS, is 2 on a
// 2-core machine). The end-to-end tests spend most of their time waiting on
// regen subprocesses, simulated decoding, kills and deadlines, not on the
// test's own CPU, so more of them than cores fit at once (issue 30: the
// package took past 10 minutes one at a time).
const e2eParallel = 6

func TestMain(m *testing.M) {
	flag.Parse()
	raiseParallel()
	dir, err := os.MkdirTemp("", "regen-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create binary dir:", err)
		os.Exit(1)
	}
	regenBin = filepath.Join(dir, "regen")
	// The test's working directory is this package's directory.
	// -buildvcs=auto: stamp the commit as a user's go build does, whatever
	// GOFLAGS says (regen version prints it).
	build := exec.Command(goTool(), "build", "-buildvcs=auto", "-o", regenBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build regen:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	stopBrowser()
	pgtest.Cleanup()
	os.RemoveAll(dir)
	os.Exit(code)
}

// raiseParallel sets -test.parallel to e2eParallel unless the command line
// chose a value (or asked for more).
func raiseParallel() {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < e2eParallel {
		_ = flag.Set("test.parallel", strconv.Itoa(e2eParallel))
	}
}

// goTool finds the go command that runs this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// TestEndToEndTestsRunInParallel: every end-to-end test (TestE2E*) calls
// t.Parallel(), or the package is back past go test's default timeout
// (issue 30); one that needs something alone says why in a comment
// "// not parallel: <reason>" in its body. Exclusive resources have
// helpers that share or serialize them: pgtest.Get (shared server),
// ownPostgres (a server to crash), startBrowser (one page at a time).
func TestEndToEndTestsRunInParallel(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "TestE2E") || fn.Body == nil {
				continue
			}
			n++
			if !callsParallel(fn.Body) && !optedOut(f, fn) {
				t.Errorf("%s: %s does not call t.Parallel() (or say \"// not parallel: <reason>\")", fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
	}
	if n < 30 {
		t.Errorf("found %d TestE2E functions in %v, want the package's 30 or more", n, files)
	}
}

// callsParallel reports whether body calls t.Parallel() at its top level.
func callsParallel(body *ast.BlockStmt) bool {
	for _, s := range body.List {
		if e, ok := s.(*ast.ExprStmt); ok {
			if c, ok := e.X.(*ast.CallExpr); ok {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Parallel" {
					return true
				}
			}
		}
	}
	return false
}

// optedOut reports whether fn's body holds a "// not parallel:" comment.
func optedOut(f *ast.File, fn *ast.FuncDecl) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > fn.Body.Lbrace && cg.End() < fn.Body.Rbrace && strings.Contains(cg.Text(), "not parallel:") {
			return true
		}
	}
	return false
}
