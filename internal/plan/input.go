package plan

// Engine names the inference server whose memory rules apply.
type Engine string

// Engines the planner knows.
const (
	SGLang Engine = "sglang"
	VLLM   Engine = "vllm"
)

// Defaults. Each is an estimate or a documented engine default; the plan
// lists which ones it used in Plan.Estimates.
const (
	// DefaultContextOverhead is what CUDA context and NCCL init take
	// before weights load. docs/engines.md §8: an RTX PRO 6000 reports 95.59
	// GiB and has ~94 GiB free after context and NCCL init.
	DefaultContextOverhead = GiB * 3 / 2
	// DefaultActivation is the room kept for activations, CUDA graphs and
	// NCCL buffers. For SGLang it is the smallest P*(1-f) slack accepted
	// (SGLang's own auto rule keeps >= 10 GiB on > 60 GB cards, docs/engines.md
	// §1.6; Kimi-K2.5 ran with ~7 GiB); for vLLM it is the profile-run peak
	// subtracted from the budget (vLLM measures it at startup).
	DefaultActivation = 5 * GiB
	// DefaultVLLMUtilization is vLLM's gpu_memory_utilization default
	// (EngineArgs, docs/engines.md §6).
	DefaultVLLMUtilization = 0.90
	// DefaultVLLMBlockSize is vLLM's KV block size in tokens.
	DefaultVLLMBlockSize = 16
	// HiCacheReservePerRank is SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES:
	// each rank refuses to start unless this much host RAM stays available
	// after its pool (docs/engines.md §2).
	HiCacheReservePerRank = 10 * GiB
	// DefaultHostOverheadBase is host RAM for the OS, SGLang's tokenizer
	// and detokenizer processes and regen itself. An estimate. The page
	// cache filled while weights load is not counted: it is reclaimable
	// and the host pool is pinned only after weights are loaded.
	DefaultHostOverheadBase = 10 * GiB
	// DefaultHostOverheadPerRank is the resident memory of one scheduler
	// process per GPU rank (Python, torch, CUDA runtime host buffers). An
	// estimate; measure with ps on a running server and override.
	DefaultHostOverheadPerRank = 5 * GiB
	// DefaultHostMargin is the share of host RAM kept free for everything
	// not modelled (other users, file buffers, fragmentation of pinned
	// allocations). Pinned memory cannot be swapped, so overcommitting it
	// hangs the machine instead of slowing it.
	DefaultHostMargin = 0.10
	// DefaultHiCacheRatio is SGLang's --hicache-ratio default (docs/engines.md §2).
	DefaultHiCacheRatio = 2.0
	// DefaultPromptTokens is the mean prompt length assumed for a lane
	// given none (neither its own nor Input.PromptTokens): an assumption,
	// listed among the plan's estimates. Chat prompts with a system prompt
	// and tool definitions are typically a few hundred to a thousand
	// tokens; --from-job replaces it with the lengths a store measured.
	DefaultPromptTokens = 1024
)

// Input is everything a plan depends on. Zero values mean "use the
// default" (listed on each field); the plan records which it used.
type Input struct {
	Model ModelConfig `json:"model"`
	// WeightBytes is the checkpoint's total tensor bytes (safetensors
	// index total_size or a measured number); 0 = estimate from Model.
	WeightBytes  int64  `json:"weight_bytes,omitempty"`
	WeightSource string `json:"weight_source,omitempty"`

	GPU  GPU `json:"gpu"`
	GPUs int `json:"gpus"` // 0 = TP*DP
	TP   int `json:"tp"`   // 0 = 1
	DP   int `json:"dp"`   // 0 = 1

	Engine Engine `json:"engine"` // "" = sglang
	// KVDtype is auto, bf16, bfloat16, fp16, float16, fp8, fp8_e4m3 or fp8_e5m2.
	KVDtype string `json:"kv_dtype"`
	// MemFraction is SGLang's --mem-fraction-static or vLLM's
	// gpu_memory_utilization; 0 = the engine default (SGLang: its auto rule
	// docs/engines.md §1.6, version-dependent; vLLM: 0.90).
	MemFraction float64 `json:"mem_fraction"`
	// FreeBeforeWeights is P, GPU memory free after CUDA/NCCL init and
	// before weights; 0 = GPU total - ContextOverhead.
	FreeBeforeWeights int64 `json:"free_before_weights,omitempty"`
	ContextOverhead   int64 `json:"context_overhead,omitempty"` // 0 = DefaultContextOverhead
	// OtherBeforeKV is GPU memory taken between P and A besides weights
	// (workspaces allocated before the KV pool); 0 = none.
	OtherBeforeKV int64 `json:"other_before_kv,omitempty"`
	// Activation: 0 = DefaultActivation. See DefaultActivation.
	Activation int64 `json:"activation,omitempty"`
	// PageSize: 0 = 1 for SGLang, 16 (block size) for vLLM.
	PageSize int `json:"page_size,omitempty"`
	// MaxTotalTokens is SGLang's --max-total-tokens cap; 0 = none.
	MaxTotalTokens int64 `json:"max_total_tokens,omitempty"`
	// ContextLen is the served context length; 0 = max_position_embeddings.
	ContextLen int `json:"context_len,omitempty"`
	// MaxRunningRequests caps running requests per replica; 0 = engine rule.
	MaxRunningRequests int `json:"max_running_requests,omitempty"`

	// HostMem is host RAM in bytes; 0 = unknown (host checks skipped,
	// hicache refused).
	HostMem             int64   `json:"host_mem,omitempty"`
	HostOverheadBase    int64   `json:"host_overhead_base,omitempty"`     // 0 = DefaultHostOverheadBase
	HostOverheadPerRank int64   `json:"host_overhead_per_rank,omitempty"` // 0 = DefaultHostOverheadPerRank
	HostMargin          float64 `json:"host_margin,omitempty"`            // 0 = DefaultHostMargin
	HiCache             HiCache `json:"hicache"`

	// Lanes and the global length defaults they fall back to. These are
	// plain fields so a job's lanes and a store's measured lengths map
	// onto them directly.
	Lanes        []Lane `json:"lanes,omitempty"`
	PromptTokens int    `json:"prompt_tokens,omitempty"` // mean prompt tokens for lanes without their own
	OutputTokens int    `json:"output_tokens,omitempty"` // mean output tokens for lanes without their own
}

// HiCache is SGLang's hierarchical cache setting. SizeGB is per TP rank in
// decimal GB (docs/engines.md §2): 8 ranks x 300 GB is 2.4 TB of pinned RAM.
type HiCache struct {
	Enabled bool    `json:"enabled"`
	SizeGB  int     `json:"size_gb,omitempty"` // --hicache-size; 0 = use Ratio
	Ratio   float64 `json:"ratio,omitempty"`   // --hicache-ratio; 0 = 2
}

// Lane is a request class: how many the user wants running at once and
// the length distribution of its prompts and outputs (means and p95s; a
// zero p95 falls back to the mean for prompts and to MaxTokens for
// outputs, the worst case).
type Lane struct {
	Name        string `json:"name"`
	Concurrency int    `json:"concurrency"` // wanted; 0 = as many as fit
	MaxTokens   int    `json:"max_tokens"`
	PromptMean  int    `json:"prompt_mean,omitempty"`
	PromptP95   int    `json:"prompt_p95,omitempty"`
	OutputMean  int    `json:"output_mean,omitempty"`
	OutputP95   int    `json:"output_p95,omitempty"`
}
