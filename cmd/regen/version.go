package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set by -ldflags "-X main.version=..." in release builds.
var version = "dev"

func init() { addCommand(newVersionCommand) }

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the regen version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						v = "dev-" + s.Value[:min(12, len(s.Value))]
					}
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), "regen", v)
			return nil
		},
	}
}
