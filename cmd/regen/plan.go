package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/plan"
)

func init() { addCommand(newPlanCommand) }

// planOptions are the flags of regen plan. Sizes are strings so users can
// write 96GB, 95.59GiB or 97887MiB.
type planOptions struct {
	model            string
	weightsBytes     string
	safetensorsIndex string
	gpu              string
	gpuMem           string
	gpus, tp, dp     int
	hostMem          string
	engine           string
	kvDtype          string
	memFraction      float64
	freeBefore       string
	contextOverhead  string
	otherBeforeKV    string
	activation       string
	pageSize         int
	maxTotalTokens   int64
	contextLen       int
	maxRunning       int
	hicache          bool
	hicacheSize      int
	hicacheRatio     float64
	hostOverhead     string
	hostOverheadRank string
	hostMargin       float64
	lanes            []string
	promptTokens     int
	outputTokens     int
	json             bool
	fromJob          string
	// capture is the job's hidden-state storage estimate (--from-job with
	// a capture section), shown after the memory plan.
	capture *capturePlan
}

func (o *planOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.model, "model", "", "Hugging Face config.json of the model (required)")
	fs.StringVar(&o.weightsBytes, "weights-bytes", "", "total checkpoint weight size (e.g. 554.3GiB or a byte count); default: estimated from the config")
	fs.StringVar(&o.safetensorsIndex, "safetensors-index", "", "model.safetensors.index.json whose metadata.total_size is the weight size")
	fs.StringVar(&o.gpu, "gpu", "", "GPU name ("+strings.Join(plan.GPUNames(), ", ")+") or memory size")
	fs.StringVar(&o.gpuMem, "gpu-mem", "", "memory per GPU: as sold (96GB means the card sold as 96 GB, with its real usable size) or as nvidia-smi reports it (97887MiB, 95.59GiB)")
	fs.IntVar(&o.gpus, "gpus", 0, "number of GPUs (default tp x dp)")
	fs.IntVar(&o.tp, "tp", 1, "tensor-parallel size")
	fs.IntVar(&o.dp, "dp", 1, "data-parallel replicas")
	fs.StringVar(&o.hostMem, "host-mem", "", "host RAM (e.g. 449GB); needed for the hierarchical cache check")
	fs.StringVar(&o.engine, "engine", "sglang", "sglang or vllm (llamacpp: llama-server sizes itself; regen reads its slots and context)")
	fs.StringVar(&o.kvDtype, "kv-dtype", "auto", "KV cache dtype: auto, bf16, fp16, fp8_e4m3, fp8_e5m2")
	fs.Float64Var(&o.memFraction, "mem-fraction", 0, "SGLang --mem-fraction-static or vLLM gpu_memory_utilization (default: engine default; SGLang's is version-dependent)")
	fs.StringVar(&o.freeBefore, "free-before-weights", "", "GPU memory free before weights load, P (default: GPU total - context overhead)")
	fs.StringVar(&o.contextOverhead, "context-overhead", "", "CUDA context + NCCL memory per GPU (default 1.5GiB)")
	fs.StringVar(&o.otherBeforeKV, "other-before-kv", "", "other GPU memory taken before the KV pool besides weights (default 0)")
	fs.StringVar(&o.activation, "activation", "", "SGLang: minimum activation slack; vLLM: activation peak (default 5GiB)")
	fs.IntVar(&o.pageSize, "page-size", 0, "KV page size in tokens (default: SGLang 1, vLLM block size 16)")
	fs.Int64Var(&o.maxTotalTokens, "max-total-tokens", 0, "SGLang --max-total-tokens cap")
	fs.IntVar(&o.contextLen, "context-length", 0, "served context length (default: max_position_embeddings)")
	fs.IntVar(&o.maxRunning, "max-running-requests", 0, "cap on running requests per replica")
	fs.BoolVar(&o.hicache, "hicache", false, "enable SGLang's hierarchical cache (implied by --hicache-size or --hicache-ratio)")
	fs.IntVar(&o.hicacheSize, "hicache-size", 0, "host KV pool in decimal GB PER TP RANK (SGLang --hicache-size)")
	fs.Float64Var(&o.hicacheRatio, "hicache-ratio", 0, "host KV pool as a multiple of the device pool (SGLang --hicache-ratio, default 2)")
	fs.StringVar(&o.hostOverhead, "host-overhead", "", "host RAM for the OS and non-GPU processes (default 10GiB)")
	fs.StringVar(&o.hostOverheadRank, "host-overhead-per-rank", "", "host RAM per GPU scheduler process (default 5GiB)")
	fs.Float64Var(&o.hostMargin, "host-margin", 0, "fraction of host RAM kept free (default 0.10)")
	fs.StringArrayVar(&o.lanes, "lane", nil, "lane name:concurrency:max_tokens[:prompt_mean[:output_mean[:prompt_p95[:output_p95]]]] (repeatable)")
	fs.IntVar(&o.promptTokens, "prompt-tokens", 0, "mean prompt tokens for lanes without their own")
	fs.IntVar(&o.outputTokens, "output-tokens", 0, "mean output tokens for lanes without their own")
	fs.BoolVar(&o.json, "json", false, "print the plan as JSON")
	fs.StringVar(&o.fromJob, "from-job", "", "take engine, launch flags, model and lanes (with lengths observed in its store) from a job file; flags given here win")
}

func newPlanCommand() *cobra.Command {
	var o planOptions
	cmd := &cobra.Command{
		Use:   "plan [JOB.yaml] --model config.json (--gpu NAME | --gpu-mem SIZE) --tp N [flags]",
		Short: "Size the server's GPU and host memory and the lanes before launching",
		Long: `plan predicts what the engine will do with the memory: weights per rank, KV
bytes per token, max_total_num_tokens (SGLang) or the GPU KV cache size (vLLM),
the hierarchical cache's host RAM (per TP rank), the concurrency each lane can
run, and the launch flags. Numbers marked ~ are estimates. It exits non-zero
with the arithmetic when the plan cannot work.

Given a job file (JOB.yaml, or --from-job) with a capture: section, it also
estimates the hidden-state files the capture writes (tokens of the done
samples x layers x hidden x dtype bytes) against the free space of
capture.dir, and refuses when they do not fit with a 5% margin; without
--model and --gpu it shows that estimate alone.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if o.fromJob != "" && o.fromJob != args[0] {
					return fmt.Errorf("give the job file once: %s or --from-job %s", args[0], o.fromJob)
				}
				o.fromJob = args[0]
			}
			var notes []string
			if o.fromJob != "" {
				var err error
				if o.capture, err = planCapture(cmd.Context(), o.fromJob); err != nil {
					return err
				}
				if notes, err = applyJob(cmd.Context(), &o, cmd.Flags().Changed); err != nil {
					return err
				}
				if o.capture != nil && (o.model == "" || o.gpu == "" && o.gpuMem == "") {
					return runCapturePlan(o, cmd.OutOrStdout())
				}
			}
			if o.engine == string(plan.LlamaCpp) {
				return plan.ErrLlamaCpp
			}
			return runPlan(o, cmd.OutOrStdout(), notes...)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// planInput turns the flags into a plan.Input.
func planInput(o planOptions) (plan.Input, []string, error) {
	var in plan.Input
	if o.model == "" {
		return in, nil, errors.New("--model config.json is required")
	}
	m, err := plan.LoadModelConfig(o.model)
	if err != nil {
		return in, nil, err
	}
	in.Model = m
	if err := planWeights(o, &in); err != nil {
		return in, nil, err
	}
	var notes []string
	if in.GPU, notes, err = planGPU(o); err != nil {
		return in, nil, err
	}
	in.GPUs, in.TP, in.DP = o.gpus, o.tp, o.dp
	in.Engine = plan.Engine(o.engine)
	in.KVDtype = o.kvDtype
	in.MemFraction = o.memFraction
	if err := planByteFlags(o, &in); err != nil {
		return in, nil, err
	}
	in.PageSize = o.pageSize
	in.MaxTotalTokens = o.maxTotalTokens
	in.ContextLen = o.contextLen
	in.MaxRunningRequests = o.maxRunning
	in.HostMargin = o.hostMargin
	if o.hicacheSize > 0 && o.hicacheRatio > 0 {
		return in, nil, errors.New("give --hicache-size or --hicache-ratio, not both")
	}
	in.HiCache = plan.HiCache{Enabled: o.hicache || o.hicacheSize > 0 || o.hicacheRatio > 0, SizeGB: o.hicacheSize, Ratio: o.hicacheRatio}
	lanes, laneNotes, err := planLanes(o)
	if err != nil {
		return in, nil, err
	}
	in.Lanes, notes = lanes, append(notes, laneNotes...)
	in.PromptTokens, in.OutputTokens = o.promptTokens, o.outputTokens
	return in, notes, nil
}

// planWeights sets the weights' size from --safetensors-index or
// --weights-bytes (neither: the planner estimates it from the model).
func planWeights(o planOptions, in *plan.Input) error {
	var err error
	switch {
	case o.safetensorsIndex != "" && o.weightsBytes != "":
		return errors.New("give --weights-bytes or --safetensors-index, not both")
	case o.safetensorsIndex != "":
		if in.WeightBytes, err = plan.LoadSafetensorsIndex(o.safetensorsIndex); err != nil {
			return err
		}
		in.WeightSource = "safetensors index " + o.safetensorsIndex
	case o.weightsBytes != "":
		if in.WeightBytes, err = plan.ParseBytes(o.weightsBytes); err != nil {
			return fmt.Errorf("--weights-bytes: %w", err)
		}
		in.WeightSource = "--weights-bytes " + o.weightsBytes
	}
	return nil
}

// planGPU reads the GPU from --gpu or --gpu-mem; exactly one is required.
func planGPU(o planOptions) (plan.GPU, []string, error) {
	switch {
	case o.gpu != "" && o.gpuMem != "":
		return plan.GPU{}, nil, errors.New("give --gpu or --gpu-mem, not both")
	case o.gpu != "":
		return plan.ParseGPU(o.gpu)
	case o.gpuMem != "":
		return plan.ParseGPU(o.gpuMem)
	default:
		return plan.GPU{}, nil, errors.New("--gpu NAME or --gpu-mem SIZE is required")
	}
}

// planByteFlags parses the memory-size flags that were given.
func planByteFlags(o planOptions, in *plan.Input) error {
	for _, s := range []struct {
		flag, val string
		dst       *int64
	}{
		{"--host-mem", o.hostMem, &in.HostMem},
		{"--free-before-weights", o.freeBefore, &in.FreeBeforeWeights},
		{"--context-overhead", o.contextOverhead, &in.ContextOverhead},
		{"--other-before-kv", o.otherBeforeKV, &in.OtherBeforeKV},
		{"--activation", o.activation, &in.Activation},
		{"--host-overhead", o.hostOverhead, &in.HostOverheadBase},
		{"--host-overhead-per-rank", o.hostOverheadRank, &in.HostOverheadPerRank},
	} {
		if s.val == "" {
			continue
		}
		var err error
		if *s.dst, err = plan.ParseBytes(s.val); err != nil {
			return fmt.Errorf("%s: %w", s.flag, err)
		}
	}
	return nil
}

// planLanes parses the --lane flags; with none it plans the lane regen run
// gives a job without lanes, and says so in a note.
func planLanes(o planOptions) ([]plan.Lane, []string, error) {
	var lanes []plan.Lane
	for _, s := range o.lanes {
		l, err := plan.ParseLane(s)
		if err != nil {
			return nil, nil, err
		}
		lanes = append(lanes, l)
	}
	if len(lanes) > 0 {
		return lanes, nil, nil
	}
	lanes = []plan.Lane{{Name: job.DefaultLaneName, Concurrency: job.DefaultConcurrency, MaxTokens: job.DefaultMaxTokens}}
	note := fmt.Sprintf("no --lane: planned regen's default lane %s (%d wanted running, max_tokens %d), as a job without lanes runs",
		job.DefaultLaneName, job.DefaultConcurrency, job.DefaultMaxTokens)
	return lanes, []string{note}, nil
}

// runPlan prints the plan (text or JSON) and, when it is refused, returns
// an error that exits 1 naming the broken rules in one line: the
// arithmetic is printed once, in the plan's REFUSED section.
func runPlan(o planOptions, out io.Writer, extraNotes ...string) error {
	in, notes, err := planInput(o)
	notes = append(notes, extraNotes...)
	if err != nil {
		return err
	}
	p, err := plan.Compute(in)
	if p == nil {
		return err
	}
	p.Notes = append(notes, p.Notes...)
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if werr := enc.Encode(struct {
			*plan.Plan
			Capture *capturePlan `json:"capture,omitempty"`
		}{p, o.capture}); werr != nil {
			return fmt.Errorf("write plan: %w", werr)
		}
	} else if werr := p.WriteText(out); werr != nil {
		return fmt.Errorf("write plan: %w", werr)
	} else if o.capture != nil {
		if werr := o.capture.writeText(out); werr != nil {
			return fmt.Errorf("write plan: %w", werr)
		}
	}
	var refused *plan.RefusalError
	if errors.As(err, &refused) {
		var rules []string
		for _, r := range refused.Refusals {
			rules = append(rules, r.Summary)
		}
		where := "the arithmetic is under REFUSED above"
		if o.json {
			where = "the arithmetic is in refusals"
		}
		if c := o.capture.refusal(); c != nil {
			rules = append(rules, c.Error())
		}
		return &exitError{code: 1, err: fmt.Errorf("refused: %s (%s)", strings.Join(rules, "; "), where)}
	}
	if err != nil {
		return err
	}
	return o.capture.exit()
}

// runCapturePlan prints the capture estimate alone: the job gives no
// model config or GPU to plan the server's memory with.
func runCapturePlan(o planOptions, out io.Writer) error {
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Capture *capturePlan `json:"capture"`
		}{o.capture}); err != nil {
			return fmt.Errorf("write plan: %w", err)
		}
	} else {
		if _, err := fmt.Fprintln(out, "no memory plan: it needs --model config.json (or a job whose model is one) and --gpu or --gpu-mem"); err != nil {
			return fmt.Errorf("write plan: %w", err)
		}
		if err := o.capture.writeText(out); err != nil {
			return fmt.Errorf("write plan: %w", err)
		}
	}
	return o.capture.exit()
}
