package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set by -ldflags "-X main.version=..." in release builds.
var version = "dev"

func init() { addCommand(newVersionCommand) }

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the regen version, the commit it was built from and the Go version",
		Long: `version prints the release version (dev for a build from source, or the
module version of go install ...@vX), the git commit and commit time the go
command stamped into the binary (with +modified when the tree had
uncommitted changes), and the Go version. regen --version prints the same.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "regen", versionString())
			return nil
		},
	}
}

// versionString describes this binary from its build information.
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version + ", " + runtime.Version()
	}
	return describeBuild(bi, version)
}

// describeBuild says which release, commit and Go built bi.
func describeBuild(bi *debug.BuildInfo, version string) string {
	v := version
	if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version // go install module@version
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	parts := []string{v}
	if rev := settings["vcs.revision"]; rev != "" {
		c := "commit " + rev[:min(12, len(rev))]
		if settings["vcs.modified"] == "true" {
			c += "+modified"
		}
		if t := settings["vcs.time"]; t != "" {
			c += " (" + t + ")"
		}
		parts = append(parts, c)
	} else {
		// go run and go build -buildvcs=false record no commit.
		parts = append(parts, "no commit recorded (built by go run or without VCS stamping)")
	}
	parts = append(parts, bi.GoVersion+" "+runtime.GOOS+"/"+runtime.GOARCH)
	return strings.Join(parts, ", ")
}
