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
	"strings"
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

// jobFileArg accepts exactly one argument, the job file, and says what is
// missing in words rather than in argument counts.
func jobFileArg(cmd *cobra.Command, args []string) error {
	usage := "usage: " + cmd.UseLine()
	if cmd.HasParent() {
		usage = "usage: " + cmd.Parent().CommandPath() + " " + cmd.Use
	}
	switch {
	case len(args) == 0:
		return fmt.Errorf("missing job file (%s)", usage)
	case len(args) > 1:
		return fmt.Errorf("one job file at a time, got %d arguments: %s (%s)", len(args), strings.Join(args, " "), usage)
	}
	return nil
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "regen",
		Short:         "Generate large synthetic datasets with self-hosted LLM servers, durably",
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("regen {{.Version}}\n")
	for _, f := range commands {
		root.AddCommand(f())
	}
	return root
}

// execute runs the command line args and returns the command that ran (for
// its name in error messages) and its error.
func execute(ctx context.Context, args []string) (*cobra.Command, error) {
	root := newRootCommand()
	root.SetArgs(args)
	return root.ExecuteContextC(ctx)
}

// stopSignals are the signals that stop a command the way Ctrl-C does: a
// runner drains, then exits. SIGHUP (a dropped SSH session) is one of them
// unless the process was started with it ignored (nohup): asking for it
// would undo that.
func stopSignals() []os.Signal {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}

func main() {
	// The first SIGINT/SIGTERM/SIGHUP cancels this context (commands
	// drain); run installs its own second-signal handler to exit at once.
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals()...)
	defer stop()
	cmd, err := execute(ctx, os.Args[1:])
	if err == nil {
		return
	}
	// "regen status: ..." names the command that failed.
	prefix := "regen:"
	if cmd != nil {
		prefix = cmd.CommandPath() + ":"
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, prefix, ee.err)
		}
		os.Exit(ee.code)
	}
	fmt.Fprintln(os.Stderr, prefix, err)
	os.Exit(1)
}
