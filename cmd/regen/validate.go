package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/regen-dev/regen/internal/job"
)

func init() { addCommand(newValidateCommand) }

func newValidateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate JOB.yaml",
		Short: "Check a job file and print what it will do",
		Long: `validate loads the job file with every default applied and prints a summary
of its sources, lanes, endpoints or server, store and output. On problems it
prints every one with its file, line and field, and exits 1.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runValidate(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0])
		},
	}
}

func runValidate(out, errOut io.Writer, path string) error {
	spec, err := job.Load(path)
	if err != nil {
		var errs []error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
		for _, e := range errs {
			fmt.Fprintln(errOut, e)
		}
		var fe *job.FieldError
		if errors.As(err, &fe) {
			fmt.Fprintf(errOut, "%s: %d problem(s)\n", path, len(errs))
		}
		return &exitError{code: 1}
	}
	return writeSpecSummary(out, spec)
}

// writeSpecSummary prints what the job will do, one aligned line per fact.
func writeSpecSummary(w io.Writer, s *job.Spec) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format+"\n", args...) }
	p("%s: ok", s.Path)
	p("name\t%s", s.Name)
	if s.Model != "" {
		p("model\t%s", s.Model)
	}
	p("sources\t%d", len(s.Sources))
	for _, src := range s.Sources {
		var mapping []string
		add := func(k, v string) {
			if v != "" {
				mapping = append(mapping, k+": "+v)
			}
		}
		add("conversations", src.Conversations)
		add("messages", src.Messages)
		add("prompt", src.Prompt)
		add("system_field", src.SystemField)
		if src.System != "" {
			mapping = append(mapping, "system: (literal)")
		}
		add("tools", src.Tools)
		add("id", src.ID)
		add("format", src.Format)
		if src.Limit > 0 {
			mapping = append(mapping, fmt.Sprintf("limit: %d", src.Limit))
		}
		line := fmt.Sprintf("\t%s\t%s\t%s", src.Partition, src.Path, strings.Join(mapping, ", "))
		if lane := fixedLane(s, src.Partition); lane != "" {
			line += "\t-> lane " + lane
		}
		p("%s", line)
	}
	p("lanes\t%d", len(s.Lanes))
	for _, l := range s.Lanes {
		var rule []string
		if len(l.Partitions) > 0 {
			rule = append(rule, "partitions "+strings.Join(l.Partitions, ","))
		}
		if l.MaxPromptTokens > 0 {
			rule = append(rule, fmt.Sprintf("prompts <= %d tokens", l.MaxPromptTokens))
		}
		if len(rule) == 0 {
			rule = append(rule, "no rule")
		}
		esc := ""
		if next, ok := s.EscalationLane(l.Name); ok {
			esc = "truncated -> " + next
		}
		p("\t%s\tconcurrency %d\tmax_tokens %d\t%s\t%s", l.Name, l.Concurrency, l.MaxTokens, strings.Join(rule, "; "), esc)
	}
	if sv := s.Server; sv != nil {
		port := fmt.Sprint(sv.Port)
		if sv.Port == 0 {
			port = "any free port"
		}
		line := fmt.Sprintf("server\t%s on %s:%s (ready within %s, hang after %s, %d restarts per %s)", sv.Engine, sv.Host, port, sv.ReadyTimeout, sv.HangTimeout, sv.Restart.Max, sv.Restart.Window)
		if len(sv.Sim) > 0 {
			b, _ := json.Marshal(sv.Sim) // plain YAML values always marshal
			line += " sim " + string(b)
		}
		p("%s", line)
	}
	if len(s.Endpoints) > 0 {
		p("endpoints\t%d", len(s.Endpoints))
		for _, e := range s.Endpoints {
			key := "no key"
			if e.APIKeyEnv != "" {
				key = "key from $" + e.APIKeyEnv
			}
			p("\t%s\t%s\t%s", e.URL, e.Engine, key)
		}
	}
	params, err := s.Generation.Params()
	if err != nil {
		return err
	}
	var gen []string
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		gen = append(gen, k+"="+string(params[k]))
	}
	gen = append(gen, "request_timeout="+s.Generation.RequestTimeout.String(), "idle_timeout="+s.Generation.IdleTimeout.String())
	p("generation\t%s", strings.Join(gen, " "))
	p("store\t%s", s.Store.DSN)
	p("output\t%s\t%s", s.Output.Dir, strings.Join(s.Output.Formats, ", "))
	p("retry\t%d attempts, backoff %s..%s", s.Retry.MaxAttempts, s.Retry.BaseDelay, s.Retry.MaxDelay)
	return tw.Flush()
}

// fixedLane is the lane every sample of partition goes to regardless of
// its prompt length, "" when lane assignment depends on the prompt.
func fixedLane(s *job.Spec, partition string) string {
	short, long := s.LaneFor(partition, 0), s.LaneFor(partition, 1<<30)
	if short == long {
		return short
	}
	return ""
}
