package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/plan"
	"github.com/regen-dev/regen/internal/store"
)

// applyJob fills the plan options a job file knows — engine, the server's
// launch flags, the model, the lanes and, when the job has run, the lengths
// it observed — without overriding any flag the user gave.
func applyJob(ctx context.Context, o *planOptions, changed func(string) bool) ([]string, error) {
	spec, err := job.LoadContext(ctx, o.fromJob)
	if err != nil {
		return nil, err
	}
	var args []string
	if spec.Server != nil {
		args = spec.Server.Args
		if !changed("engine") && (spec.Server.Engine == "sglang" || spec.Server.Engine == "vllm") {
			o.engine = spec.Server.Engine
		}
		if !changed("engine") && spec.Server.Engine == string(plan.LlamaCpp) {
			return nil, fmt.Errorf("%s launches llama-server: %w", spec.Path, plan.ErrLlamaCpp)
		}
	}
	flags := launchFlags(args)
	if err := applyLaunchFlags(o, flags, changed); err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Path, err)
	}
	if !changed("model") {
		applyJobModel(o, spec.Model, flags)
	}
	if changed("lane") {
		return nil, nil
	}
	return applyJobLanes(ctx, o, spec)
}

// applyLaunchFlags sets the options the server's launch flags give, under
// either engine's spelling, unless the user gave them.
func applyLaunchFlags(o *planOptions, flags map[string]string, changed func(string) bool) error {
	for _, s := range []struct {
		name string
		dst  *int
		keys []string
	}{
		{"tp", &o.tp, []string{"--tp", "--tp-size", "--tensor-parallel-size"}},
		{"dp", &o.dp, []string{"--dp", "--dp-size", "--data-parallel-size"}},
		{"hicache-size", &o.hicacheSize, []string{"--hicache-size"}},
		{"max-running-requests", &o.maxRunning, []string{"--max-running-requests", "--max-num-seqs"}},
		{"page-size", &o.pageSize, []string{"--page-size", "--block-size"}},
		{"context-length", &o.contextLen, []string{"--context-length", "--max-model-len"}},
	} {
		if changed(s.name) {
			continue
		}
		for _, k := range s.keys {
			if v, ok := flags[k]; ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					return fmt.Errorf("server.args %s %q: %w", k, v, err)
				}
				*s.dst = n
			}
		}
	}
	var err error
	for _, k := range []string{"--mem-fraction-static", "--gpu-memory-utilization"} {
		if v, ok := flags[k]; ok && !changed("mem-fraction") {
			if o.memFraction, err = strconv.ParseFloat(v, 64); err != nil {
				return fmt.Errorf("server.args %s %q: %w", k, v, err)
			}
		}
	}
	if v, ok := flags["--hicache-ratio"]; ok && !changed("hicache-ratio") {
		if o.hicacheRatio, err = strconv.ParseFloat(v, 64); err != nil {
			return fmt.Errorf("server.args --hicache-ratio %q: %w", v, err)
		}
	}
	if _, ok := flags["--enable-hierarchical-cache"]; ok && !changed("hicache") {
		o.hicache = true
	}
	if v, ok := flags["--kv-cache-dtype"]; ok && !changed("kv-dtype") {
		o.kvDtype = v
	}
	return nil
}

// applyJobModel takes the model's config.json from --model-path, else
// from the job's model, when that is a file or a directory holding it.
func applyJobModel(o *planOptions, model string, flags map[string]string) {
	if v, ok := flags["--model-path"]; ok {
		model = v
	}
	if fi, err := os.Stat(model); err == nil && fi.IsDir() {
		model = filepath.Join(model, "config.json")
	}
	if _, err := os.Stat(model); err == nil {
		o.model = model
	}
}

// applyJobLanes sets --lane from the job's lanes, with the lengths they
// observed when the job has run.
func applyJobLanes(ctx context.Context, o *planOptions, spec *job.Spec) ([]string, error) {
	lanes, observed, err := jobLanes(ctx, spec)
	if err != nil {
		return nil, err
	}
	o.lanes = nil
	for _, l := range lanes {
		s := fmt.Sprintf("%s:%d:%d", l.Name, l.Concurrency, l.MaxTokens)
		if l.PromptMean > 0 || l.OutputMean > 0 {
			// An auto lane plans as many as fit (concurrency 0). A lane that has not finished a sample yet falls back to --prompt-tokens/--output-tokens.
			s += fmt.Sprintf(":%d:%d:%d:%d", l.PromptMean, l.OutputMean, l.PromptP95, l.OutputP95)
		}
		o.lanes = append(o.lanes, s)
	}
	if observed > 0 {
		return []string{fmt.Sprintf("lane lengths observed over %d finished samples of job %s", observed, spec.Name)}, nil
	}
	return nil, nil
}

// launchFlags reads "--flag value" and "--flag=value" pairs; a flag without a
// value maps to "".
func launchFlags(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue
		}
		if k, v, ok := strings.Cut(a, "="); ok {
			m[k] = v
			continue
		}
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			m[a] = args[i+1]
			i++
			continue
		}
		m[a] = ""
	}
	return m
}

// jobLanes are the job's lanes with the lengths its store has observed.
func jobLanes(ctx context.Context, spec *job.Spec) ([]plan.Lane, int, error) {
	prompt := map[string][]int{}
	output := map[string][]int{}
	n := 0
	st, err := openExisting(ctx, spec, "")
	switch {
	case errors.Is(err, store.ErrNoStore): // never run: nothing observed yet
	case err != nil:
		return nil, 0, err
	default:
		defer st.Close()
		err = st.Finished(ctx, func(r store.Row) error {
			if r.State != store.Done {
				return nil
			}
			n++
			prompt[r.Lane] = append(prompt[r.Lane], r.Result.PromptTokens)
			output[r.Lane] = append(output[r.Lane], r.Result.CompletionTokens)
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("read observed lengths: %w", err)
		}
	}
	var lanes []plan.Lane
	for _, l := range spec.Lanes {
		lanes = append(lanes, plan.Observed(plan.Lane{Name: l.Name, Concurrency: l.Concurrency, MaxTokens: l.MaxTokens}, prompt[l.Name], output[l.Name]))
	}
	return lanes, n, nil
}
