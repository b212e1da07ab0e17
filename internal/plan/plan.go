package plan

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Plan is the computed memory and concurrency plan. Byte fields are bytes;
// the text renderer shows GiB for GPU memory and decimal GB for host cache
// sizes, the units each engine uses.
type Plan struct {
	Engine Engine       `json:"engine"`
	Model  ModelSummary `json:"model"`
	GPU    GPUSummary   `json:"gpu"`

	// Headline is what the plan says first when the hardware cannot hold
	// the requests asked for: how many fit, then the options.
	Headline []string `json:"headline,omitempty"`

	Weights   WeightsPlan    `json:"weights"`
	KV        KVPlan         `json:"kv"`
	Memory    MemoryPlan     `json:"memory"`
	HostCache *HostCachePlan `json:"host_cache,omitempty"`
	Host      *HostPlan      `json:"host,omitempty"`
	Lanes     *LanesPlan     `json:"lanes,omitempty"`

	// Flags are the launch arguments ready to paste; YAML is the same as a
	// job file's server section.
	Flags []string `json:"flags"`
	YAML  string   `json:"yaml"`

	// Estimates names every number that is not read from the inputs.
	Estimates []string  `json:"estimates"`
	Notes     []string  `json:"notes,omitempty"`
	Refusals  []Refusal `json:"refusals,omitempty"`
}

// ModelSummary identifies the model and its attention kind.
type ModelSummary struct {
	Name      string `json:"name,omitempty"`
	Type      string `json:"model_type,omitempty"`
	Attention string `json:"attention"` // MHA, GQA or MLA
	Layers    int    `json:"layers"`
	Dtype     string `json:"dtype"`
	MoE       bool   `json:"moe"`
}

// GPUSummary is the hardware and parallelism the plan assumes.
type GPUSummary struct {
	Name     string `json:"name"`
	MemBytes int64  `json:"mem_bytes"`
	Source   string `json:"source"`
	Count    int    `json:"count"`
	TP       int    `json:"tp"`
	DP       int    `json:"dp"`
	Ranks    int    `json:"ranks"` // TP*DP processes, each with its own KV pool and host cache
}

// WeightsPlan is the weight memory per rank.
type WeightsPlan struct {
	TotalBytes   int64  `json:"total_bytes"`
	PerRankBytes int64  `json:"per_rank_bytes"`
	Estimated    bool   `json:"estimated"`
	Source       string `json:"source"`
	// ReplicatedBytes is the part of PerRankBytes every rank holds whole.
	ReplicatedBytes int64          `json:"replicated_bytes"`
	Breakdown       WeightEstimate `json:"breakdown"`
}

// KVPlan is the KV cache's bytes per token on one rank.
type KVPlan struct {
	Dtype              string `json:"dtype"`
	DtypeSource        string `json:"dtype_source"`
	ElemBytes          int    `json:"elem_bytes"`
	HeadsPerRank       int    `json:"heads_per_rank"` // 1 for MLA (one latent)
	DimPerHead         int    `json:"dim_per_head"`   // K+V dims (GQA) or kv_lora_rank+qk_rope_head_dim (MLA)
	Layers             int    `json:"layers"`
	CellBytes          int64  `json:"cell_bytes"` // per token per rank
	ReplicatedAcrossTP bool   `json:"replicated_across_tp"`
	Formula            string `json:"formula"`
}

// MemoryPlan is the engine's KV pool sizing on one rank.
type MemoryPlan struct {
	GPUTotalBytes          int64   `json:"gpu_total_bytes"`
	FreeBeforeWeightsBytes int64   `json:"free_before_weights_bytes"` // P
	MemFraction            float64 `json:"mem_fraction"`
	MemFractionSource      string  `json:"mem_fraction_source"`
	WeightsPerRankBytes    int64   `json:"weights_per_rank_bytes"`
	OtherBeforeKVBytes     int64   `json:"other_before_kv_bytes"`
	AvailAfterWeightsBytes int64   `json:"avail_after_weights_bytes"` // A (SGLang)
	// SlackBytes is what the engine keeps outside the static pool: SGLang
	// P*(1-f), vLLM total*(1-u).
	SlackBytes      int64 `json:"slack_bytes"`
	ActivationBytes int64 `json:"activation_bytes"`
	KVPoolBytes     int64 `json:"kv_pool_bytes"` // rest (SGLang) or available KV memory (vLLM)
	PageSize        int   `json:"page_size"`
	// MaxTotalTokens is the predicted max_total_num_tokens (SGLang) or GPU
	// KV cache size in tokens (vLLM) of one replica.
	MaxTotalTokens int64    `json:"max_total_tokens"`
	Formula        []string `json:"formula"`
}

// HostCachePlan is SGLang's host KV pool, one per rank.
type HostCachePlan struct {
	Ranks         int     `json:"ranks"`
	SizeGBPerRank int     `json:"size_gb_per_rank,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	BytesPerToken int64   `json:"bytes_per_token"`
	TokensPerRank int64   `json:"tokens_per_rank"`
	BytesPerRank  int64   `json:"bytes_per_rank"`
	TotalBytes    int64   `json:"total_bytes"`
	// MaxSafeSizeGB is the largest --hicache-size per rank that fits host
	// RAM after overhead, margin and the per-rank reserve (0: none fits).
	MaxSafeSizeGB int      `json:"max_safe_size_gb"`
	Fits          bool     `json:"fits"`
	Formula       []string `json:"formula"`
}

// HostPlan is the host RAM budget.
type HostPlan struct {
	TotalBytes          int64   `json:"total_bytes"`
	OverheadBaseBytes   int64   `json:"overhead_base_bytes"`
	OverheadPerRank     int64   `json:"overhead_per_rank_bytes"`
	OverheadBytes       int64   `json:"overhead_bytes"`
	MarginFraction      float64 `json:"margin_fraction"`
	MarginBytes         int64   `json:"margin_bytes"`
	ReserveBytes        int64   `json:"reserve_bytes"` // hicache reserve x ranks (0 without hicache)
	HostCacheBytes      int64   `json:"host_cache_bytes"`
	LeftBytes           int64   `json:"left_bytes"`
	BudgetForCacheBytes int64   `json:"budget_for_cache_bytes"` // total - overhead - margin - reserve
}

// LanesPlan is the recommended concurrency per lane.
type LanesPlan struct {
	Replicas       int     `json:"replicas"`
	CapacityTokens int64   `json:"capacity_tokens"` // max_total_tokens x replicas
	HeadroomTokens int64   `json:"headroom_tokens"` // one p95 request per replica
	UsableTokens   int64   `json:"usable_tokens"`
	DemandTokens   int64   `json:"demand_tokens"` // sum of wanted x tokens per request
	Scale          float64 `json:"scale"`
	// RunningCap is the cap on running requests per replica (the user's or
	// the engine's), MaxRunningRequests the flag value per replica.
	RunningCap         int        `json:"running_cap"`
	RunningCapSource   string     `json:"running_cap_source"`
	MaxRunningRequests int        `json:"max_running_requests"`
	Lanes              []LanePlan `json:"lanes"`
	Formula            []string   `json:"formula"`
}

// LanePlan is one lane's share.
type LanePlan struct {
	Lane
	TokensPerRequest int64  `json:"tokens_per_request"` // prompt mean + output mean
	LongestRequest   int64  `json:"longest_request"`    // prompt p95 + max_tokens
	Wanted           int    `json:"wanted"`
	Recommended      int    `json:"recommended"`
	KVTokens         int64  `json:"kv_tokens"`
	Math             string `json:"math"`
}

// Compute builds the plan. Input errors (bad TP, unknown KV dtype) return
// a nil Plan. When the plan is computed but cannot work, it returns the
// Plan and a *RefusalError.
func Compute(in Input) (*Plan, error) {
	in, err := normalize(in)
	if err != nil {
		return nil, err
	}
	p := &Plan{Engine: in.Engine}
	m := in.Model
	p.Model = ModelSummary{Name: m.Name, Type: m.ModelType, Layers: m.NumLayers, Dtype: m.Dtype, MoE: m.IsMoE(), Attention: attentionKind(m)}
	p.GPU = GPUSummary{Name: in.GPU.Name, MemBytes: in.GPU.MemBytes, Source: in.GPU.Source, Count: in.GPUs, TP: in.TP, DP: in.DP, Ranks: in.TP * in.DP}

	planWeights(p, in)
	if err := planKV(p, in); err != nil {
		return nil, err
	}
	planMemory(p, in)
	planHost(p, in)
	planLanes(p, in)
	planFlags(p, in)
	planHeadline(p, in)
	if len(p.Refusals) > 0 {
		return p, &RefusalError{Refusals: p.Refusals}
	}
	return p, nil
}

func normalize(in Input) (Input, error) {
	if in.Engine == "" {
		in.Engine = SGLang
	}
	if in.Engine == LlamaCpp {
		return in, ErrLlamaCpp
	}
	if in.Engine != SGLang && in.Engine != VLLM {
		return in, fmt.Errorf("engine %q: want sglang or vllm", in.Engine)
	}
	if in.TP == 0 {
		in.TP = 1
	}
	if in.DP == 0 {
		in.DP = 1
	}
	if in.TP < 0 || in.DP < 0 {
		return in, errors.New("tp and dp must be positive")
	}
	if in.GPUs == 0 {
		in.GPUs = in.TP * in.DP
	}
	if in.GPUs != in.TP*in.DP {
		return in, fmt.Errorf("gpus %d != tp %d x dp %d", in.GPUs, in.TP, in.DP)
	}
	if in.GPU.MemBytes <= 0 {
		return in, errors.New("gpu memory unknown: give a GPU name or a size")
	}
	if in.Model.NumLayers <= 0 || in.Model.HiddenSize <= 0 {
		return in, errors.New("model config has no layers or hidden size")
	}
	if in.MemFraction < 0 || in.MemFraction >= 1 {
		return in, fmt.Errorf("mem fraction %v: want 0 < f < 1", in.MemFraction)
	}
	if in.HiCache.Enabled && in.Engine != SGLang {
		return in, fmt.Errorf("hierarchical cache is an SGLang feature; engine is %s", in.Engine)
	}
	if in.HiCache.Enabled && in.HostMem <= 0 {
		return in, errors.New("hierarchical cache needs the host RAM size to be checked")
	}
	if in.HiCache.SizeGB < 0 || in.HiCache.Ratio < 0 {
		return in, errors.New("hicache size and ratio must not be negative")
	}
	if in.HostMargin < 0 || in.HostMargin >= 1 {
		return in, fmt.Errorf("host margin %v: want 0 <= m < 1", in.HostMargin)
	}
	seen := map[string]bool{}
	for i, l := range in.Lanes {
		if l.Name == "" {
			return in, fmt.Errorf("lane %d: name missing", i+1)
		}
		if seen[l.Name] {
			return in, fmt.Errorf("lane %s: listed twice", l.Name)
		}
		seen[l.Name] = true
		if l.MaxTokens <= 0 {
			return in, fmt.Errorf("lane %s: max_tokens must be positive", l.Name)
		}
		if l.Concurrency < 0 {
			return in, fmt.Errorf("lane %s: concurrency must not be negative", l.Name)
		}
	}
	return in, nil
}

func attentionKind(m ModelConfig) string {
	switch {
	case m.IsMLA():
		return "MLA"
	case m.NumKVHeads < m.NumAttentionHeads:
		return "GQA"
	}
	return "MHA"
}

func (p *Plan) estimate(format string, a ...any) {
	p.Estimates = append(p.Estimates, fmt.Sprintf(format, a...))
}
func (p *Plan) note(format string, a ...any) { p.Notes = append(p.Notes, fmt.Sprintf(format, a...)) }
func (p *Plan) refuse(k RefusalKind, summary string, lines ...string) {
	p.Refusals = append(p.Refusals, Refusal{Kind: k, Summary: summary, Lines: lines})
}

func planWeights(p *Plan, in Input) {
	est := EstimateWeights(in.Model, in.TP)
	w := WeightsPlan{Breakdown: est}
	for _, part := range est.Parts {
		if part.Loaded && part.Replicated {
			w.ReplicatedBytes += part.PerRankBytes
		}
	}
	if in.WeightBytes > 0 {
		// The checkpoint size is exact; how it splits over ranks is not:
		// each rank gets the same share of it as in the config estimate
		// (which also drops tensors the engine does not load).
		w.TotalBytes = in.WeightBytes
		share := float64(est.PerRankBytes) / float64(est.CheckpointBytes)
		w.PerRankBytes = int64(math.Round(float64(in.WeightBytes) * share))
		w.ReplicatedBytes = int64(math.Round(float64(w.ReplicatedBytes) * float64(in.WeightBytes) / float64(est.CheckpointBytes)))
		w.Source = nonEmpty(in.WeightSource, "given")
		p.estimate("weights per rank: the given %.2f GiB split over TP %d in the proportions of the config-based estimate (%.4f of the total per rank)", gib(in.WeightBytes), in.TP, share)
	} else {
		w.TotalBytes = est.CheckpointBytes
		w.PerRankBytes = est.PerRankBytes
		w.Estimated = true
		w.Source = "estimated from config.json dimensions and quantization_config"
		p.estimate("weights: %.2f GiB total, %.2f GiB per rank, estimated from config.json (pass --weights-bytes or --safetensors-index for the real size)", gib(w.TotalBytes), gib(w.PerRankBytes))
	}
	for _, n := range est.Notes {
		p.note("%s", n)
	}
	p.Weights = w
}

// KVElemBytes resolves a --kv-cache-dtype value for a model. auto is the
// model dtype, except that SGLang picks fp8_e4m3 when the checkpoint's
// quantization_config has kv_cache_quant_algo FP8 (docs/engines.md §1.4).
func KVElemBytes(kvDtype string, m ModelConfig, engine Engine) (name string, bytes int, source string, err error) {
	switch strings.ToLower(kvDtype) {
	case "", "auto":
		if engine != VLLM && m.Quant != nil && m.Quant.KVCacheFP8 {
			return "fp8_e4m3", 1, "auto: quantization_config kv_cache_quant_algo FP8", nil
		}
		b, _ := dtypeBytes(m.Dtype)
		return "auto", b, fmt.Sprintf("auto: model dtype %s", m.Dtype), nil
	case "bf16", "bfloat16":
		return "bf16", 2, "given", nil
	case "fp16", "float16", "half":
		return "fp16", 2, "given", nil
	case "fp8", "fp8_e4m3":
		return "fp8_e4m3", 1, "given", nil
	case "fp8_e5m2":
		return "fp8_e5m2", 1, "given", nil
	}
	return "", 0, "", fmt.Errorf("kv dtype %q: want auto, bf16, fp16, fp8_e4m3 or fp8_e5m2", kvDtype)
}

// KVCellBytes is the KV bytes per token on one TP rank (docs/engines.md §1.3):
// MHA/GQA max(1, kv_heads/tp) * (head_dim + v_head_dim) * layers * bytes;
// MLA (kv_lora_rank + qk_rope_head_dim) * layers * bytes on every rank.
func KVCellBytes(m ModelConfig, tp, elemBytes int) int64 {
	if m.IsMLA() {
		return int64(m.KVLoraRank+m.QKRopeHeadDim) * int64(m.NumLayers) * int64(elemBytes)
	}
	return int64(max(1, m.NumKVHeads/max(tp, 1))) * int64(2*m.HeadDim) * int64(m.NumLayers) * int64(elemBytes)
}

func planKV(p *Plan, in Input) error {
	m := in.Model
	name, eb, src, err := KVElemBytes(in.KVDtype, m, in.Engine)
	if err != nil {
		return err
	}
	if in.Engine == SGLang && m.Quant != nil && m.Quant.KVCacheScheme && !m.Quant.KVCacheFP8 && (in.KVDtype == "" || in.KVDtype == "auto") {
		p.note("quantization_config declares a kv_cache_scheme; whether SGLang's auto then picks fp8 was not checked: pass --kv-dtype explicitly")
	}
	kv := KVPlan{Dtype: name, DtypeSource: src, ElemBytes: eb, Layers: m.NumLayers, CellBytes: KVCellBytes(m, in.TP, eb)}
	if m.IsMLA() {
		kv.HeadsPerRank, kv.DimPerHead = 1, m.KVLoraRank+m.QKRopeHeadDim
		kv.ReplicatedAcrossTP = in.TP > 1
		kv.Formula = fmt.Sprintf("(kv_lora_rank %d + qk_rope_head_dim %d) x %d layers x %d B = %d B/token, the same on every TP rank",
			m.KVLoraRank, m.QKRopeHeadDim, m.NumLayers, eb, kv.CellBytes)
	} else {
		kv.HeadsPerRank, kv.DimPerHead = max(1, m.NumKVHeads/in.TP), 2*m.HeadDim
		kv.ReplicatedAcrossTP = in.TP > m.NumKVHeads
		kv.Formula = fmt.Sprintf("max(1, %d kv heads / tp %d) = %d x (head_dim %d + v_head_dim %d) x %d layers x %d B = %d B/token per rank",
			m.NumKVHeads, in.TP, kv.HeadsPerRank, m.HeadDim, m.HeadDim, m.NumLayers, eb, kv.CellBytes)
	}
	p.KV = kv
	return nil
}

// SGLangAutoMemFraction is SGLang's default --mem-fraction-static as read
// in one revision (docs/engines.md §1.6), with chunked_prefill_size 8192 and
// cuda_graph_max_bs 512; smaller defaults on small cards make the real
// value larger, so this errs low. It ignores the VLM and speculative
// terms. Version-dependent: pass --mem-fraction explicitly.
func SGLangAutoMemFraction(gpuMemBytes int64, tp int) float64 {
	gpuMB := float64(gpuMemBytes) / float64(MiB)
	reserved := 512 + 8192*1.5 + 512*2 + float64(tp)/8*1024
	if gpuMB > 60*1024 {
		reserved = math.Max(reserved, 10*1024)
	}
	return math.Round((gpuMB-reserved)/gpuMB*1000) / 1000
}

// ImpliedMemFraction inverts SGLang's formula: the --mem-fraction-static
// that yields an observed token count given P, weights per rank and cell
// size. Used to calibrate the plan against a server's own report.
func ImpliedMemFraction(freeBeforeWeights, weightsPerRank, other int64, cellBytes, tokens int64) float64 {
	a := float64(freeBeforeWeights - weightsPerRank - other)
	return 1 - (a-float64(tokens*cellBytes))/float64(freeBeforeWeights)
}

func planMemory(p *Plan, in Input) {
	mem := MemoryPlan{GPUTotalBytes: in.GPU.MemBytes, WeightsPerRankBytes: p.Weights.PerRankBytes, OtherBeforeKVBytes: in.OtherBeforeKV}
	overhead := in.ContextOverhead
	if overhead == 0 {
		overhead = DefaultContextOverhead
	}
	P := in.FreeBeforeWeights
	if P == 0 {
		P = in.GPU.MemBytes - overhead
		p.estimate("P (free before weights) = GPU %.2f GiB - %.2f GiB CUDA/NCCL context = %.2f GiB (measure it: the engine logs free memory before loading weights)", gib(in.GPU.MemBytes), gib(overhead), gib(P))
	}
	mem.FreeBeforeWeightsBytes = P
	mem.ActivationBytes = in.Activation
	if mem.ActivationBytes == 0 {
		mem.ActivationBytes = DefaultActivation
		if in.Engine == VLLM {
			p.estimate("vLLM activation peak %.2f GiB (vLLM measures it in its profile run)", gib(mem.ActivationBytes))
		} else {
			p.estimate("activation minimum %.2f GiB: the least P*(1-f) slack accepted for activations, CUDA graphs and NCCL", gib(mem.ActivationBytes))
		}
	}
	mem.PageSize = in.PageSize
	if mem.PageSize == 0 {
		mem.PageSize = 1
		if in.Engine == VLLM {
			mem.PageSize = DefaultVLLMBlockSize
		}
	}
	cell := p.KV.CellBytes
	W := mem.WeightsPerRankBytes

	if in.Engine == VLLM {
		u := in.MemFraction
		mem.MemFractionSource = "given"
		if u == 0 {
			u = DefaultVLLMUtilization
			mem.MemFractionSource = "vLLM default gpu_memory_utilization 0.90 (docs/engines.md §6)"
		}
		mem.MemFraction = u
		T := float64(in.GPU.MemBytes)
		budget := T * u
		mem.SlackBytes = int64(T - budget)
		avail := budget - float64(W) - float64(mem.ActivationBytes) - float64(in.OtherBeforeKV)
		mem.KVPoolBytes = int64(avail)
		blockBytes := cell * int64(mem.PageSize)
		if avail > 0 {
			mem.MaxTotalTokens = int64(avail) / blockBytes * int64(mem.PageSize)
		}
		mem.Formula = []string{
			fmt.Sprintf("budget = total %.2f GiB x gpu_memory_utilization %.3f = %.2f GiB", gib(in.GPU.MemBytes), u, budget/float64(GiB)),
			fmt.Sprintf("kv memory = budget - weights %.2f GiB - activation peak %.2f GiB - other %.2f GiB = %.2f GiB", gib(W), gib(mem.ActivationBytes), gib(in.OtherBeforeKV), avail/float64(GiB)),
			fmt.Sprintf("blocks = floor(%d B / (%d tokens x %d B)) = %d; tokens = blocks x %d = %d", int64(avail), mem.PageSize, cell, max(0, mem.MaxTotalTokens/int64(mem.PageSize)), mem.PageSize, mem.MaxTotalTokens),
		}
		if budget > float64(P) {
			p.refuse(RefuseUtilization, "gpu_memory_utilization asks for more than is free at startup",
				fmt.Sprintf("total %.2f GiB x %.3f = %.2f GiB > %.2f GiB free after CUDA/NCCL init", gib(in.GPU.MemBytes), u, budget/float64(GiB), gib(P)),
				fmt.Sprintf("largest utilization: %.3f", math.Floor(float64(P)/T*1000)/1000))
		}
		if float64(W) > budget {
			p.refuse(RefuseWeights, "weights do not fit the utilization budget",
				fmt.Sprintf("weights per rank %.2f GiB > budget %.2f GiB", gib(W), budget/float64(GiB)))
		} else if avail <= 0 || mem.MaxTotalTokens <= 0 {
			p.refuse(RefuseActivations, "no memory left for the KV cache",
				mem.Formula[1], fmt.Sprintf("raise gpu_memory_utilization above %.3f or use more GPUs", (float64(W)+float64(mem.ActivationBytes)+float64(in.OtherBeforeKV))/T))
		}
		p.Memory = mem
		return
	}

	f := in.MemFraction
	mem.MemFractionSource = "given"
	if f == 0 {
		f = SGLangAutoMemFraction(in.GPU.MemBytes, in.TP)
		mem.MemFractionSource = "SGLang auto rule of one release, docs/engines.md §1.6 (version-dependent; pass --mem-fraction explicitly)"
		p.estimate("mem fraction %.3f from SGLang's auto rule in one revision; other revisions differ", f)
	}
	mem.MemFraction = f
	A := P - W - in.OtherBeforeKV
	slack := float64(P) * (1 - f)
	rest := float64(A) - slack
	mem.AvailAfterWeightsBytes = A
	mem.SlackBytes = int64(slack)
	mem.KVPoolBytes = int64(rest)
	if rest > 0 {
		tokens := int64(rest) / cell
		tokens = tokens / int64(mem.PageSize) * int64(mem.PageSize)
		if in.MaxTotalTokens > 0 && in.MaxTotalTokens < tokens {
			tokens = in.MaxTotalTokens
		}
		mem.MaxTotalTokens = tokens
	}
	mem.Formula = []string{
		fmt.Sprintf("A = P %.2f GiB - weights %.2f GiB - other %.2f GiB = %.2f GiB", gib(P), gib(W), gib(in.OtherBeforeKV), gib(A)),
		fmt.Sprintf("rest = A - P x (1 - f %.3f) = %.2f - %.2f = %.2f GiB", f, gib(A), slack/float64(GiB), rest/float64(GiB)),
		fmt.Sprintf("tokens = floor(rest x 2^30 / %d B) floored to page %d = %d", cell, mem.PageSize, mem.MaxTotalTokens),
	}
	if in.MaxTotalTokens > 0 {
		mem.Formula = append(mem.Formula, fmt.Sprintf("capped by --max-total-tokens %d", in.MaxTotalTokens))
	}
	p.Memory = mem
	switch {
	case W+in.OtherBeforeKV >= P:
		p.refuse(RefuseWeights, "weights do not fit the GPU",
			fmt.Sprintf("weights per rank %.2f GiB + other %.2f GiB >= P %.2f GiB free before weights", gib(W), gib(in.OtherBeforeKV), gib(P)),
			fmt.Sprintf("need TP > %d, a smaller quantization, or bigger GPUs", in.TP))
	case rest <= 0 || mem.MaxTotalTokens <= 0:
		p.refuse(RefuseActivations, "--mem-fraction-static leaves no memory for the KV cache",
			mem.Formula[0], mem.Formula[1],
			fmt.Sprintf("raise --mem-fraction-static above %.3f (= 1 - A/P), keeping P x (1-f) >= %.2f GiB for activations (f <= %.3f)", 1-float64(A)/float64(P), gib(mem.ActivationBytes), 1-float64(mem.ActivationBytes)/float64(P)))
	case slack < float64(mem.ActivationBytes):
		p.refuse(RefuseActivations, "--mem-fraction-static leaves too little room for activations",
			fmt.Sprintf("P x (1 - f) = %.2f GiB x %.3f = %.2f GiB < activation minimum %.2f GiB", gib(P), 1-f, slack/float64(GiB), gib(mem.ActivationBytes)),
			fmt.Sprintf("use --mem-fraction-static <= %.3f (= 1 - %.2f / %.2f)", math.Floor((1-float64(mem.ActivationBytes)/float64(P))*1000)/1000, gib(mem.ActivationBytes), gib(P)))
	}
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
