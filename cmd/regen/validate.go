package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/source"
	"github.com/regen-dev/regen/internal/store/backend"
)

func init() { addCommand(newValidateCommand) }

type validateOptions struct {
	offline bool
	rows    int
}

func (o *validateOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.offline, "offline", false, "check the job file alone, not the source files it names")
	fs.IntVar(&o.rows, "rows", 20, "read this many rows of each source to check its field mapping")
}

func newValidateCommand() *cobra.Command {
	var o validateOptions
	cmd := &cobra.Command{
		Use:   "validate JOB.yaml",
		Short: "Check a job file and its sources, and print what it will do",
		Long: `validate loads the job file with every default applied and prints a summary
of its sources, lanes, endpoints or server, store and output. It reports every
problem at once, each with its file, line and field: unknown keys (with the
nearest known one), values of the wrong type, invalid settings, endpoint URLs
that are not a server root.

Unless --offline, it also looks at the sources: each path, glob or directory
must match readable files (it says how many), and the first rows (--rows) are
read through the field mapping, so a mapped field that no row has, or a
Parquet column that does not exist, is reported before a run; and at
output.dir, which must be a folder regen can write (or be creatable).

Exits 1 when there is any problem; an interrupt (Ctrl-C, SIGTERM, SIGHUP)
ends it at once, whatever it is reading, with exit 130.`,
		Args: jobFileArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runValidate(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// runValidate reports every problem in one run: the job file's (keys,
// types, settings), then, as far as the file could be decoded, its
// sources' and its output folder's, skipping only the parts whose own
// settings are wrong. Validate has nothing to drain, so an interrupt ends
// it at once, whatever it is reading (a source that never answers, a huge
// file): the work runs aside and writes to buffers, copied out only when
// it finishes.
func runValidate(ctx context.Context, out, errOut io.Writer, path string, o validateOptions) error {
	type done struct {
		out, errOut bytes.Buffer
		err         error
	}
	finished := make(chan *done, 1) // buffered: abandoned work still ends
	go func() {
		d := &done{}
		d.err = validate(ctx, &d.out, &d.errOut, path, o)
		finished <- d
	}()
	select {
	case d := <-finished:
		if _, err := out.Write(d.out.Bytes()); err != nil {
			return err
		}
		if _, err := errOut.Write(d.errOut.Bytes()); err != nil {
			return err
		}
		return d.err
	case <-ctx.Done():
		return &exitError{code: 130, err: fmt.Errorf("validate %s: interrupted: %w", path, context.Cause(ctx))}
	}
}

func validate(ctx context.Context, out, errOut io.Writer, path string, o validateOptions) error {
	spec, err := job.LoadPartialContext(ctx, path)
	var problems []error
	if err != nil {
		problems = job.Problems(err)
		var fe *job.FieldError
		if spec == nil && !errors.As(err, &fe) { // unreadable, interrupted
			for _, e := range problems {
				fmt.Fprintln(errOut, e)
			}
			return &exitError{code: 1, err: err}
		}
	}
	fileOK := len(problems) == 0
	var found []sourceFinding
	if spec != nil && !o.offline {
		var more []error
		found, more = inspectSources(ctx, spec, o.rows, problems)
		problems = append(problems, more...)
		if !hasProblemAt(problems, "output.dir") {
			if err := outputProblem(spec); err != nil {
				problems = append(problems, err)
			}
		}
	}
	if fileOK { // a job file with problems has no summary worth reading
		if err := writeSpecSummary(out, spec, found, len(problems) == 0); err != nil {
			return err
		}
		for _, w := range engine.TokenIDWarnings(spec) {
			fmt.Fprintln(errOut, w)
		}
	}
	if len(problems) > 0 {
		for _, e := range problems {
			fmt.Fprintln(errOut, e)
		}
		fmt.Fprintf(errOut, "%s: %d problem(s)\n", path, len(problems))
		return &exitError{code: 1}
	}
	return nil
}

// sourceFinding is what validate saw of one source's files.
type sourceFinding struct {
	files, rows, good int
	firstBad          string
}

func (f sourceFinding) String() string {
	files := "1 file"
	if f.files != 1 {
		files = fmt.Sprintf("%d files", f.files)
	}
	s := fmt.Sprintf("%s; first %d rows: %d good", files, f.rows, f.good)
	if bad := f.rows - f.good; bad > 0 {
		s += fmt.Sprintf(", %d bad (dead letters at ingest; first: %s)", bad, f.firstBad)
	}
	return s
}

// hasProblemAt reports whether one of problems is at field or inside it.
func hasProblemAt(problems []error, field string) bool {
	for _, e := range problems {
		var fe *job.FieldError
		if errors.As(e, &fe) && (fe.Field == field || strings.HasPrefix(fe.Field, field+".") || strings.HasPrefix(fe.Field, field+"[")) {
			return true
		}
	}
	return false
}

// inspectSources looks at the files of every source whose settings have no
// problem in known; problems name the job file's line and the source
// option at fault.
func inspectSources(ctx context.Context, spec *job.Spec, rows int, known []error) ([]sourceFinding, []error) {
	found := make([]sourceFinding, len(spec.Sources))
	var problems []error
	for i, src := range spec.Sources {
		p := fmt.Sprintf("sources[%d]", i)
		if hasProblemAt(known, p) {
			continue
		}
		in, err := source.Inspect(ctx, src, spec.Dir, rows)
		if err != nil {
			problems = append(problems, spec.FieldErrorf(p+".path", "%s", spec.RelText(err.Error())))
			continue
		}
		found[i] = sourceFinding{files: len(in.Files), rows: in.Rows, good: in.Good}
		if len(in.Bad) > 0 {
			found[i].firstBad = spec.Rel(in.Bad[0].Origin) + ": " + job.Clip(in.Bad[0].Reason, job.MaxShownBytes)
		}
		if in.Rows > 0 && in.Good == 0 && len(in.Missing) == 0 {
			problems = append(problems, allBad(spec, p, in))
		}
		for _, m := range in.Missing {
			problems = append(problems, spec.FieldErrorf(p+"."+m.Option, "field %q is in none of the first %d rows (they have: %s)",
				m.Field, in.Rows, strings.Join(m.Seen, ", ")))
		}
	}
	return found, problems
}

// allBad is the problem of a source none of whose rows read can become a
// sample: a run would ingest nothing from it. It names the mapping option
// at fault and the likely fix when the rows' shape says it.
func allBad(spec *job.Spec, p string, in source.Inspection) error {
	field := p + ".path"
	if in.Hint.Option != "" {
		field = p + "." + in.Hint.Option
	}
	msg := fmt.Sprintf("none of the first %d rows can become a sample (first: %s: %s)",
		in.Rows, spec.Rel(in.Bad[0].Origin), job.Clip(in.Bad[0].Reason, job.MaxShownBytes))
	if h := in.Hint.String(); h != "" {
		msg += "; " + h
	}
	return spec.FieldErrorf(field, "%s", msg)
}

// writeSpecSummary prints what the job will do, one aligned line per fact,
// with what was found of the sources when they were looked at.
func writeSpecSummary(w io.Writer, s *job.Spec, found []sourceFinding, ok bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// Every cell is cut past a line's worth, whatever value it shows (a
	// path, a URL, a name): a job file may hold megabyte strings.
	p := func(format string, args ...any) {
		cells := strings.Split(fmt.Sprintf(format, args...), "\t")
		for i, c := range cells {
			cells[i] = job.Clip(c, 4*job.MaxShownBytes)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if ok {
		p("%s: ok", s.Path)
	} else {
		p("%s: what it would do (problems below)", s.Path)
	}
	p("name\t%s", job.Clip(s.Name, job.MaxShownBytes))
	if s.Model != "" {
		p("model\t%s", job.Clip(s.Model, job.MaxShownBytes))
	}
	p("sources\t%d", len(s.Sources))
	for _, src := range s.Sources {
		line := fmt.Sprintf("\t%s\t%s\t%s", src.Partition, s.Rel(src.Path), sourceMapping(src))
		if lane := fixedLane(s, src.Partition); lane != "" {
			line += "\t-> lane " + lane
		}
		p("%s", line)
	}
	for i, f := range found {
		label := ""
		if i == 0 {
			label = "files"
		}
		if f.files > 0 {
			p("%s\t%s\t%s", label, s.Sources[i].Partition, f)
		} else {
			p("%s\t%s\tnot readable (below)", label, s.Sources[i].Partition)
		}
	}
	p("lanes\t%d", len(s.Lanes))
	for _, l := range s.Lanes {
		esc := ""
		if next, ok := s.EscalationLane(l.Name); ok {
			esc = "truncated -> " + next
		}
		p("\t%s\tconcurrency %s\tmax_tokens %d\t%s\t%s", l.Name, l.ConcurrencyText(), l.MaxTokens, laneRule(l), esc)
	}
	if s.Server != nil {
		p("server\t%s", serverSummary(s.Server))
	}
	if len(s.Endpoints) > 0 {
		p("endpoints\t%d", len(s.Endpoints))
		for _, e := range s.Endpoints {
			p("\t%s", endpointSummary(e))
		}
	}
	gen, err := generationSummary(s.Generation)
	if err != nil {
		return err
	}
	p("generation\t%s", gen)
	p("store\t%s", storeSummary(s))
	p("output\t%s\t%s", s.Rel(s.Output.Dir), strings.Join(s.Output.Formats, ", "))
	p("retry\t%d attempts, backoff %s..%s", s.Retry.MaxAttempts, s.Retry.BaseDelay, s.Retry.MaxDelay)
	return tw.Flush()
}

// sourceMapping lists the source's mapping keys that are set.
func sourceMapping(src job.Source) string {
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
	return strings.Join(mapping, ", ")
}

// laneRule says which samples the lane takes.
func laneRule(l job.Lane) string {
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
	return strings.Join(rule, "; ")
}

// serverSummary is the server regen launches: where, its timeouts and
// restart budget, and the simulator's settings when it is the simulator.
func serverSummary(sv *job.Server) string {
	port := fmt.Sprint(sv.Port)
	if sv.Port == 0 {
		port = "any free port"
	}
	line := fmt.Sprintf("%s on %s:%s (ready within %s, hang after %s, %d restarts per %s)", sv.Engine, sv.Host, port, sv.ReadyTimeout, sv.HangTimeout, sv.Restart.Max, sv.Restart.Window)
	if len(sv.Sim) > 0 {
		b, _ := json.Marshal(sv.Sim) // plain YAML values always marshal
		line += " sim " + job.Clip(string(b), job.MaxShownBytes)
	}
	return line
}

// endpointSummary is one endpoint's tab-separated URL, engine and key.
func endpointSummary(e job.Endpoint) string {
	key := "no key"
	if e.APIKeyEnv != "" {
		key = "key from $" + e.APIKeyEnv
	}
	engine := e.Engine
	if e.Detect {
		engine = "engine asked of the server"
	}
	return e.URL + "\t" + engine + "\t" + key
}

// generationSummary is the request parameters, sorted, then the timeouts.
func generationSummary(g job.Generation) (string, error) {
	params, err := g.Params()
	if err != nil {
		return "", err
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	gen := make([]string, 0, len(keys)+2)
	for _, k := range keys {
		gen = append(gen, k+"="+job.Clip(string(params[k]), job.MaxShownBytes))
	}
	gen = append(gen, "request_timeout="+g.RequestTimeout.String(), "idle_timeout="+g.IdleTimeout.String())
	return strings.Join(gen, " "), nil
}

// storeSummary is where the job's store is, as a run would resolve it
// (REGEN_STORE overrides store.dsn), without any password.
func storeSummary(s *job.Spec) string {
	t, err := backend.Resolve(s)
	switch {
	case err != nil:
		return "invalid: " + err.Error()
	case t.Backend == "postgres":
		return fmt.Sprintf("postgres %s, shared by every worker (from %s)", t, t.From)
	case t.From == backend.EnvStore:
		return s.Rel(t.Path) + " (from " + backend.EnvStore + ")"
	}
	return s.Rel(s.Store.DSN)
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
