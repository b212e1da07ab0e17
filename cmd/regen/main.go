// Command regen generates large synthetic datasets with self-hosted LLM
// servers and never loses work. This package only wires flags to the
// internal packages; each subcommand lives in its own file and registers
// itself with addCommand.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// exitError carries a specific process exit code (status uses 1 and 2).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

var commands []func() *cobra.Command

// addCommand registers a subcommand constructor; called from init in each file.
func addCommand(f func() *cobra.Command) { commands = append(commands, f) }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "regen",
		Short:         "Generate large synthetic datasets with self-hosted LLM servers, durably",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, f := range commands {
		root.AddCommand(f())
	}
	return root
}

func main() {
	// The first SIGINT/SIGTERM cancels this context (commands drain);
	// run installs its own second-signal handler to exit at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newRootCommand().ExecuteContext(ctx)
	if err == nil {
		return
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "regen:", ee.err)
		}
		os.Exit(ee.code)
	}
	fmt.Fprintln(os.Stderr, "regen:", err)
	os.Exit(1)
}
