package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/dispatch"
	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/monitor"
	"github.com/regen-dev/regen/internal/probe"
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
	if r.o.NewConfig && hadOne && prev.Fingerprint != fp.Hash {
		var live []string
		if err := r.untilStore(ctx, func(ctx context.Context) (err error) {
			live, err = r.liveOthers(ctx)
			return err
		}); err != nil {
			return err
		}
		if len(live) > 0 {
			return fmt.Errorf("--new-config: job %s is being run by %s; stop every worker first: they would go on storing answers of the old configuration",
				spec.Name, strings.Join(live, ", "))
		}
		opts.NewGeneration = true
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
	r.gen = g
	if hadOne && g.N > prev.N {
		msg := fmt.Sprintf("configuration generation %d started (fingerprint %.12s): %d samples requeued, %d answers of generation %d kept in the history",
			g.N, g.Fingerprint, g.Requeued, prev.Answers, prev.N)
		r.note("regen: " + msg)
		r.event(ctx, store.Event{Kind: "config", Subject: "job", Evidence: msg})
		r.o.Logger.Info("new configuration generation", "generation", g.N, "fingerprint", g.Fingerprint, "requeued", g.Requeued)
	}
	return nil
}

// liveOthers lists the other workers running the job now: a new
// generation waits for them to stop, or they would go on storing answers
// of the old configuration.
func (r *runState) liveOthers(ctx context.Context) ([]string, error) {
	hbs, err := r.o.Store.Heartbeats(ctx)
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	var live []string
	for _, hb := range hbs {
		var beat monitor.Beat
		_ = json.Unmarshal(hb.Counters, &beat)
		if hb.Owner == r.owner || beat.Exited || time.Since(hb.Time) > r.o.Spec.Monitor.DeadAfter ||
			(hb.Host == r.host && !runnerAlive(hb.PID)) {
			continue
		}
		live = append(live, fmt.Sprintf("pid %d on %s", hb.PID, hb.Host))
	}
	return live, nil
}

// servedModel is the model id a server answers with: the one it lists, or
// the job's model among several; "" when that cannot be told.
func servedModel(served []string, want string) string {
	switch {
	case len(served) == 1:
		return served[0]
	case want != "" && slices.Contains(served, want):
		return want
	}
	return ""
}

// checkServed records the model the server at url answers with for the
// current generation, the first time one is known, and refuses a server
// answering with another one: its answers would mix two models in one
// dataset.
func (r *runState) checkServed(ctx context.Context, url string, served []string) (refusal string) {
	id := servedModel(served, r.o.Spec.Model)
	if id == "" || r.gen.N == 0 {
		return ""
	}
	recorded, err := r.o.Store.SetServedModel(ctx, r.gen.N, id)
	if err != nil {
		r.storeFailed(ctx, err)
		return ""
	}
	if recorded == id {
		return ""
	}
	refusal = fmt.Sprintf("serves %q, but configuration generation %d was generated with %q (served_model: %s -> %s); "+
		"no request sent: serve %q again, or name the new model in model: in %s and run regen run --new-config",
		id, r.gen.N, recorded, recorded, id, recorded, r.o.Spec.Path)
	r.o.Logger.Warn("served model changed", "endpoint", url, "served", id, "recorded", recorded, "generation", r.gen.N)
	r.event(ctx, store.Event{Kind: "model_check", Subject: url, Evidence: refusal})
	r.note("regen: " + url + " refused: " + refusal)
	return refusal
}

// identify reads the server's version, stamped with its engine on every
// answer it gives (a server that does not say is recorded without one).
func (r *runState) identify(ctx context.Context, url string, d engine.Dialect) {
	ctx, cancel := context.WithTimeout(ctx, modelCheckTimeout)
	defer cancel()
	v, err := probe.Version(ctx, nil, url, d)
	if err != nil {
		r.o.Logger.Info("server version unknown", "endpoint", url, "err", err)
	}
	r.disp.SetServer(url, dispatch.Server{Engine: d.Name, Version: v})
}
