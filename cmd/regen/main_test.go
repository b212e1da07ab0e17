package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/regen-dev/regen/internal/store/postgres/pgtest"
)

// regenBin is the regen binary the end-to-end tests run as real
// subprocesses; TestMain builds it once per test binary. It is built without
// -race even under `go test -race`: the subprocesses are the system under
// test, the race detector covers the packages' own tests.
var regenBin string

func TestMain(m *testing.M) {
	flag.Parse()
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

// goTool finds the go command that runs this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
