package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/regen-dev/regen/internal/ingest"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

// ConfigError is a run refused before any request because the job file
// would change what answers are, against the configuration the store's
// answers were generated with.
type ConfigError struct {
	Job        string
	JobFile    string
	Generation store.Generation // the store's current one
	Diff       []string         // "field: old -> new", one per field
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %s changes what answers would be, against configuration generation %d (fingerprint %.12s, %d answers stored):\n",
		e.Job, e.JobFile, e.Generation.N, e.Generation.Fingerprint, e.Generation.Answers)
	for _, d := range e.Diff {
		fmt.Fprintf(&b, "  %s\n", d)
	}
	b.WriteString("nothing was sent. Restore the job file to resume, or run `regen run --new-config` to accept the change: " +
		"every sample is generated again with it (the answers stored so far are kept in the store's history, not exported)")
	return b.String()
}

// legacySamePerPrompt returns legacy, the fingerprint an earlier regen gave
// this configuration without samples_per_prompt, when the store's files
// were ingested with the job's samples_per_prompt (the same configuration,
// fingerprinted the old way), else "": samples_per_prompt changed.
func (r *runState) legacySamePerPrompt(ctx context.Context, legacy string) (string, error) {
	in := ingest.New(r.o.Spec, r.o.Store, r.o.Logger, nil)
	plan, err := in.Plan()
	if err != nil {
		return "", nil // a missing source fails the run at ingest, with its own message
	}
	var same bool
	if err := r.untilStore(ctx, func(ctx context.Context) (err error) {
		same, err = in.CopiesAsIngested(ctx, plan)
		return err
	}); err != nil || !same {
		return "", err
	}
	return legacy, nil
}

// configure checks the job's configuration against the store's current
// generation before anything is ingested or sent: the same configuration
// goes on, another one is refused (ConfigError) unless NewConfig starts a
// new generation, which returns every sample to pending. A store that does
// not answer is waited for (untilStore); a refusal is returned at once.
func (r *runState) configure(ctx context.Context) error {
	spec := r.o.Spec
	fp, err := spec.Fingerprint()
	if err != nil {
		return err
	}
	var gens []store.Generation
	if err := r.untilStore(ctx, func(ctx context.Context) (err error) {
		gens, err = r.o.Store.Generations(ctx)
		return err
	}); err != nil {
		return err
	}
	prev, hadOne := store.Current(gens)
	opts := store.ConfigureOptions{}
	if legacy, ok, err := spec.LegacyFingerprint(); err != nil {
		return err
	} else if ok && hadOne && prev.Fingerprint == legacy.Hash {
		if opts.Legacy, err = r.legacySamePerPrompt(ctx, legacy.Hash); err != nil {
			return err
		}
	}
	if r.o.NewConfig && hadOne && prev.Fingerprint != fp.Hash && prev.Fingerprint != opts.Legacy {
		var live []string
		if err := r.untilStore(ctx, func(ctx context.Context) (err error) {
			live, err = r.crew.LiveOthers(ctx)
			return err
		}); err != nil {
			return err
		}
		if len(live) > 0 {
			return fmt.Errorf("--new-config: job %s is being run by %s; stop every worker first: they would go on storing answers of the old configuration",
				spec.Name, strings.Join(live, ", "))
		}
		opts.NewGeneration = true
		// Bodies stored under another mapping are rebuilt before they are sent.
		if opts.Rebuild, err = job.RebuiltSources(prev.Config, fp.Canonical); err != nil {
			return err
		}
		for _, src := range spec.Sources {
			for _, l := range spec.LaneRanges(src.Partition) {
				opts.Lanes = append(opts.Lanes, store.LaneRange(l))
			}
		}
	}
	var g store.Generation
	var changed *store.ConfigChangedError
	err = r.untilStore(ctx, func(ctx context.Context) error {
		var err error
		g, err = r.o.Store.Configure(ctx, store.Config{Fingerprint: fp.Hash, Canonical: fp.Canonical}, opts)
		if errors.As(err, &changed) {
			return nil // a verdict, not an outage
		}
		return err
	})
	if err != nil {
		return err
	}
	if changed != nil {
		diff, derr := job.ConfigDiff(changed.Current.Config, fp.Canonical)
		if derr != nil {
			return fmt.Errorf("%w (and its difference cannot be shown: %v)", err, derr)
		}
		changed.Current.Answers = prev.Answers
		return &ConfigError{Job: spec.Name, JobFile: spec.Path, Generation: changed.Current, Diff: diff}
	}
	r.id.gen = g
	if hadOne && g.N > prev.N {
		msg := fmt.Sprintf("configuration generation %d started (fingerprint %.12s): %d samples requeued, %d answers of generation %d kept in the history",
			g.N, g.Fingerprint, g.Requeued, prev.Answers, prev.N)
		if len(opts.Rebuild) > 0 {
			msg += fmt.Sprintf("; the requests of %s are rebuilt from their sources before they are sent", strings.Join(opts.Rebuild, ", "))
		}
		r.note("regen: " + msg)
		r.event(ctx, store.Event{Kind: "config", Subject: "job", Evidence: msg})
		r.o.Logger.Info("new configuration generation", "generation", g.N, "fingerprint", g.Fingerprint, "requeued", g.Requeued)
	}
	return nil
}
