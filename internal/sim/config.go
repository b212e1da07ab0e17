package sim

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Config holds every knob of the simulator. Durations are simulated time:
// the server runs them Speed times faster in real time.
type Config struct {
	Engine string // "sglang" (default), "vllm" or "llamacpp": routes, metric names, health rules, log lines
	// APIShape picks the engine's routes and names: "current" (default)
	// or "previous" (engines.go, docs/engines.md §13).
	APIShape string
	// Slots is llama-server's --parallel: requests decoded at once, each
	// slot ContextLen / Slots of the context (llamacpp only).
	Slots int
	// DP is the number of data-parallel ranks SGLang presents (/v1/loads,
	// internal_states); one scheduler stands behind all of them.
	DP        int
	ModelName string // served model name (--served-model-name); default: ModelPath
	ModelPath string // --model-path, echoed in server info

	KVTokens           int     // KV pool size in tokens (max_total_num_tokens)
	MaxTotalTokens     int     // --max-total-tokens: caps KVTokens when > 0
	MaxRunningRequests int     // 0 = SGLang's rule: min(clamp(kv/context*512, 2048, 4096), kv/2)
	ContextLen         int     // model context length
	MaxPrefillTokens   int     // uncached prompt tokens per prefill batch
	ChunkedPrefillSize int     // echoed in logs and server info
	TP                 int     // --tp, echoed
	MemFractionStatic  float64 // --mem-fraction-static, echoed

	Speed      float64       // 1 = real time; 60 = a simulated minute per real second
	LoadTime   time.Duration // before the port binds (weights loading)
	WarmupTime time.Duration // after binding, before ready (health answers 503)

	// Profile names the set of step times below (profile.go): calibrated
	// (the default) or fast. Setting a step time's flag overrides it.
	Profile          string
	DecodeBase       time.Duration // fixed cost of one decode step
	DecodePerReq     time.Duration // added per running request
	DecodePerKToken  time.Duration // added per 1000 KV tokens in use
	PrefillBase      time.Duration // fixed cost of one prefill batch
	PrefillPerKToken time.Duration // added per 1000 uncached prompt tokens

	ScheduleConservativeness float64 // multiplies the initial new-token ratio
	// PriorityScheduling orders the queue by the requests' priority field,
	// higher values first (SGLang's --enable-priority-scheduling), lower
	// first with LowPriorityFirst or as vLLM (--scheduling-policy priority).
	PriorityScheduling bool
	LowPriorityFirst   bool
	// CacheAnswers keeps a finished answer's KV in the prefix cache, keyed
	// as the next turn sends it back (cacheAnswer), as SGLang and vLLM do.
	CacheAnswers bool
	// MissLog, when set, appends a JSON line per later conversation turn
	// to this file: its cached tokens against the turn before's prompt and
	// answer, and why it fell short (missdiag.go). A measuring aid.
	MissLog                 string
	InitNewTokenRatio       float64 // share of max_tokens reserved at admission
	MinNewTokenRatioFactor  float64 // floor = init ratio * this
	NewTokenRatioDecaySteps int     // decode steps to decay from init to floor
	ClipMaxNewTokens        int     // max_tokens considered at admission
	RetractDecodeSteps      int     // room kept per request after a retraction
	DecodeLogInterval       int     // decode steps between Decode batch lines and gauge updates
	StreamInterval          int     // tokens per streamed chunk (SGLang --stream-interval; 0 or 1 = every token)
	VLLMLogInterval         time.Duration

	BytesPerToken     float64 // prompt token estimate = bytes / this
	OutputMean        int     // mean output tokens (lognormal)
	OutputSigma       float64 // lognormal sigma
	TruncateFraction  float64 // share of requests that run to max_tokens
	DefaultMaxTokens  int     // when a request sets none; 0 = context length - prompt
	Reasoning         string  // auto (from chat_template_kwargs) | always | never
	ReasoningFraction float64 // share of output tokens that are reasoning_content
	// ChatTemplate renders token ids: append-only (every message as sent)
	// or drop-reasoning (earlier assistant turns without their reasoning,
	// as Kimi-K2.5's template: a later prompt then does not start with an
	// earlier prompt and answer as generated).
	ChatTemplate     string
	ToolCallFraction float64 // share of requests with tools that call one

	HealthTimeout   time.Duration // /health generation probe timeout (SGLang: 20 s)
	WatchdogTimeout time.Duration // a hung batch crashes the server after this; 0 = off
	Seed            int64

	// Fault shortcuts from flags; each non-zero group becomes one Fault.
	CrashAfterRequests  int
	CrashAfterTokens    int
	CrashAt             time.Duration
	CrashKVAbove        float64
	CrashKVFor          time.Duration
	CrashExitCode       int
	CrashError          string // exception | oom | nccl | abrupt
	HangAt              time.Duration
	HangAfterRequests   int
	HangFor             time.Duration
	ZombieAt            time.Duration
	ZombieAfterRequest  int
	SlowFactor          float64
	SlowAt              time.Duration
	SlowFor             time.Duration
	ErrorCount          int
	ErrorStatus         int
	ErrorMessage        string
	ErrorAfterRequests  int
	ResetCount          int
	ResetAfterTokens    int
	MalformedCount      int
	MalformedAfterTok   int
	CutPrompt           string // cut the stream of every request whose last user message holds this
	CutAfterTokens      int
	ThrottleAt          time.Duration
	ThrottleFor         time.Duration
	ThrottleStatus      int
	ThrottleRetryAfter  time.Duration
	ThrottleProbability float64
	BrokenAfterRequests int
	BrokenAt            time.Duration
	BrokenFor           time.Duration
	BrokenStatus        int
	BrokenMessage       string
	Scenario            string // YAML file with a list of faults

	// Hidden-state capture, vLLM's extract_hidden_states contract
	// (capture.go): with HiddenStates set, each non-streamed completion
	// writes <HiddenStates>/<request id>.safetensors and names it in
	// kv_transfer_params.hidden_states_path.
	HiddenStates           string // the connector's shared_storage_path
	HiddenSize             int
	HiddenLayers           int
	HiddenDType            string        // bf16 | f16 | f32
	HiddenStatesFault      string        // nan | inf | wrong-ids | missing | truncated | slow | wrong-prompt-ids
	HiddenStatesFaultEvery int           // the fault hits every Nth capture request (1 = all)
	HiddenStatesSlow       time.Duration // slow: the file is finished this long after the answer (simulated)

	// RenderSkew: vLLM's chat render (render.go) answers one id off for
	// requests whose last user message holds this text, as a server whose
	// render and generation disagree would.
	RenderSkew string

	Faults []Fault // programmatic faults, added to the ones above

	// RecordRequest, when set, is called with the body of every generation
	// request before it is answered (tests count requests per sample and
	// turn with it). It must not keep the slice.
	RecordRequest func(body []byte)
}

// DefaultConfig returns a configuration that behaves like one SGLang
// server with Kimi-K2.5 on 8 GPUs, in real time, without faults; its step
// times are the calibrated profile's (profile.go).
func DefaultConfig() Config {
	c := Config{
		Engine:                   "sglang",
		APIShape:                 ShapeCurrent,
		Slots:                    4,
		DP:                       1,
		ModelName:                "",
		ModelPath:                "moonshotai/Kimi-K2.5",
		KVTokens:                 231120,
		ContextLen:               262144,
		MaxPrefillTokens:         16384,
		ChunkedPrefillSize:       8192,
		TP:                       8,
		MemFractionStatic:        0.85,
		Speed:                    1,
		LoadTime:                 2 * time.Second,
		WarmupTime:               500 * time.Millisecond,
		ScheduleConservativeness: 1,
		CacheAnswers:             true,
		InitNewTokenRatio:        0.7,
		MinNewTokenRatioFactor:   0.14,
		NewTokenRatioDecaySteps:  600,
		ClipMaxNewTokens:         4096,
		RetractDecodeSteps:       20,
		DecodeLogInterval:        40,
		VLLMLogInterval:          10 * time.Second,
		BytesPerToken:            4,
		OutputMean:               400,
		OutputSigma:              0.8,
		TruncateFraction:         0.02,
		Reasoning:                "auto",
		ReasoningFraction:        0.3,
		ChatTemplate:             TemplateAppendOnly,
		ToolCallFraction:         0.5,
		HealthTimeout:            20 * time.Second,
		WatchdogTimeout:          300 * time.Second,
		CrashExitCode:            0, // 0 = 1, or 137 for an abrupt crash (as if SIGKILLed)
		CrashError:               "exception",
		ErrorStatus:              503,
		ResetAfterTokens:         5,
		MalformedAfterTok:        5,
		CutAfterTokens:           3,
		ThrottleStatus:           429,
		ThrottleRetryAfter:       time.Second,
		HiddenSize:               64,
		HiddenLayers:             3,
		HiddenDType:              "bf16",
		HiddenStatesFaultEvery:   1,
		HiddenStatesSlow:         2 * time.Second,
	}
	c.setProfile(profiles[0])
	return c
}

// RegisterFlags binds every knob to fs with the current values of c as
// defaults. Flag names follow SGLang's where SGLang has the knob, so a
// script can pass SGLang's command line to the simulator.
func RegisterFlags(fs *pflag.FlagSet, c *Config) {
	registerServerFlags(fs, c)
	registerCostFlags(fs, c)
	registerOutputFlags(fs, c)
	registerFaultFlags(fs, c)
	registerCaptureFlags(fs, c)
}

// registerServerFlags binds the server the simulator presents: engine dialect, model, pool and limits.
func registerServerFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&c.Engine, "engine", c.Engine, "dialect to imitate: sglang, vllm or llamacpp (routes, metric names, health rules, log lines)")
	fs.StringVar(&c.APIShape, "api-shape", c.APIShape, "the engine's API as of today (current) or before (previous): SGLang /v1/loads and /server_info or only /get_server_info; vLLM kv_cache_usage_perc, /load and max_model_len or gpu_cache_usage_perc")
	fs.IntVar(&c.Slots, "parallel", c.Slots, "llamacpp: slots (llama-server --parallel); each gets --context-length / slots tokens")
	fs.IntVar(&c.DP, "dp", c.DP, "sglang: data-parallel ranks presented in /v1/loads and /server_info (the pool and load split evenly)")
	fs.StringVar(&c.ModelName, "served-model-name", c.ModelName, "model name served in /v1/models and responses (default: --model-path)")
	fs.StringVar(&c.ModelPath, "model-path", c.ModelPath, "model path (only echoed; nothing is loaded)")
	fs.IntVar(&c.KVTokens, "kv-tokens", c.KVTokens, "KV cache pool size in tokens (max_total_num_tokens)")
	fs.IntVar(&c.MaxTotalTokens, "max-total-tokens", c.MaxTotalTokens, "upper cap on the KV pool, like SGLang's flag (0 = none)")
	fs.IntVar(&c.MaxRunningRequests, "max-running-requests", c.MaxRunningRequests, "cap on running requests (0 = SGLang's default rule)")
	fs.IntVar(&c.ContextLen, "context-length", c.ContextLen, "model context length in tokens")
	fs.IntVar(&c.MaxPrefillTokens, "max-prefill-tokens", c.MaxPrefillTokens, "uncached prompt tokens per prefill batch")
	fs.IntVar(&c.ChunkedPrefillSize, "chunked-prefill-size", c.ChunkedPrefillSize, "echoed in logs and server info")
	fs.IntVar(&c.TP, "tp", c.TP, "tensor parallel size (echoed)")
	fs.Float64Var(&c.MemFractionStatic, "mem-fraction-static", c.MemFractionStatic, "echoed in server info")
	fs.BoolVar(&c.PriorityScheduling, "enable-priority-scheduling", c.PriorityScheduling, "order the queue by each request's priority field (SGLang's flag; vLLM's --scheduling-policy priority), reported in server info")
	fs.BoolVar(&c.CacheAnswers, "cache-answers", c.CacheAnswers, "keep a finished answer in the prefix cache as the next turn sends it back, as SGLang and vLLM do (false: only prompts are cached)")
	fs.StringVar(&c.MissLog, "miss-log", c.MissLog, "append a JSON line per later conversation turn to this file: its cache hit against the turn before's prompt and answer, and why it fell short (a measuring aid; off when empty)")
	fs.BoolVar(&c.LowPriorityFirst, "schedule-low-priority-values-first", c.LowPriorityFirst, "sglang: lower priority values go first (SGLang's flag; vLLM always schedules lower values first)")
}

// registerCostFlags binds the cost model: time scale, prefill and decode step times, admission and streaming.
func registerCostFlags(fs *pflag.FlagSet, c *Config) {
	fs.Float64Var(&c.Speed, "speed", c.Speed, "time scale: 1 = real time, 60 = one simulated minute per second")
	durationVar(fs, &c.LoadTime, "load-time", "simulated weight loading before the port binds")
	durationVar(fs, &c.WarmupTime, "warmup-time", "after binding, /health answers 503 for this long")
	registerProfileFlag(fs, c)
	durationVar(fs, &c.DecodeBase, "decode-base", "fixed time of one decode step")
	durationVar(fs, &c.DecodePerReq, "decode-per-req", "decode step time added per running request")
	durationVar(fs, &c.DecodePerKToken, "decode-per-ktoken", "decode step time added per 1000 KV tokens in use")
	durationVar(fs, &c.PrefillBase, "prefill-base", "fixed time of one prefill batch")
	durationVar(fs, &c.PrefillPerKToken, "prefill-per-ktoken", "prefill time per 1000 uncached prompt tokens")
	fs.Float64Var(&c.ScheduleConservativeness, "schedule-conservativeness", c.ScheduleConservativeness, "multiplies the initial new-token ratio (SGLang's flag)")
	fs.Float64Var(&c.InitNewTokenRatio, "init-new-token-ratio", c.InitNewTokenRatio, "share of max_tokens reserved at admission, before decay")
	fs.Float64Var(&c.MinNewTokenRatioFactor, "min-new-token-ratio-factor", c.MinNewTokenRatioFactor, "floor of the new-token ratio as a share of the initial ratio")
	fs.IntVar(&c.NewTokenRatioDecaySteps, "new-token-ratio-decay-steps", c.NewTokenRatioDecaySteps, "decode steps to decay the ratio from initial to floor")
	fs.IntVar(&c.ClipMaxNewTokens, "clip-max-new-tokens", c.ClipMaxNewTokens, "max_tokens considered when reserving at admission")
	fs.IntVar(&c.RetractDecodeSteps, "retract-decode-steps", c.RetractDecodeSteps, "free tokens per running request kept after a retraction")
	fs.IntVar(&c.DecodeLogInterval, "decode-log-interval", c.DecodeLogInterval, "decode steps between Decode batch lines and gauge updates")
	fs.IntVar(&c.StreamInterval, "stream-interval", c.StreamInterval, "tokens per streamed chunk, as SGLang's flag: the stream gets a chunk with this many tokens' text (fewer at a change of part or at the end)")
}

// registerOutputFlags binds what the answers look like: lengths, reasoning, tool calls, chat template.
func registerOutputFlags(fs *pflag.FlagSet, c *Config) {
	durationVar(fs, &c.VLLMLogInterval, "vllm-log-interval", "interval of vLLM's throughput log line")
	fs.Float64Var(&c.BytesPerToken, "bytes-per-token", c.BytesPerToken, "prompt token estimate: message bytes divided by this")
	fs.IntVar(&c.OutputMean, "output-mean", c.OutputMean, "mean output length in tokens (lognormal, capped at max_tokens)")
	fs.Float64Var(&c.OutputSigma, "output-sigma", c.OutputSigma, "sigma of the lognormal output length")
	fs.Float64Var(&c.TruncateFraction, "truncate-fraction", c.TruncateFraction, "share of requests that run to max_tokens (finish_reason length)")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", c.DefaultMaxTokens, "max_tokens when a request sets none (0 = context length minus prompt)")
	fs.StringVar(&c.Reasoning, "reasoning", c.Reasoning, "reasoning_content: auto (when chat_template_kwargs thinking/enable_thinking is true), always, never")
	fs.StringVar(&c.ChatTemplate, "chat-template", c.ChatTemplate, "the token-id chat template: append-only, or drop-reasoning (earlier assistant turns rendered without reasoning)")
	fs.Float64Var(&c.ReasoningFraction, "reasoning-fraction", c.ReasoningFraction, "share of output tokens sent as reasoning_content")
	fs.Float64Var(&c.ToolCallFraction, "tool-call-fraction", c.ToolCallFraction, "share of requests with tools that answer with a tool call")
}

// registerFaultFlags binds injected faults: crashes, hangs, errors, cuts, throttles.
func registerFaultFlags(fs *pflag.FlagSet, c *Config) {
	durationVar(fs, &c.HealthTimeout, "health-timeout", "/health generation probe timeout (SGLANG_HEALTH_CHECK_TIMEOUT)")
	durationVar(fs, &c.WatchdogTimeout, "watchdog-timeout", "a batch stuck this long crashes the server (0 = off)")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "seed for output lengths and content")
	fs.IntVar(&c.CrashAfterRequests, "crash-after-requests", c.CrashAfterRequests, "fault: crash once N generation requests have arrived")
	fs.IntVar(&c.CrashAfterTokens, "crash-after-tokens", c.CrashAfterTokens, "fault: crash once N tokens have been streamed (mid-stream)")
	durationVar(fs, &c.CrashAt, "crash-after", "fault: crash this long after ready")
	fs.Float64Var(&c.CrashKVAbove, "crash-kv-above", c.CrashKVAbove, "fault: crash when KV usage stays at or above this share for --crash-kv-for")
	durationVar(fs, &c.CrashKVFor, "crash-kv-for", "fault: how long KV usage must stay high before the crash")
	fs.IntVar(&c.CrashExitCode, "crash-exit-code", c.CrashExitCode, "exit code of a crash fault (0 = 1, or 137 for --crash-error=abrupt)")
	fs.StringVar(&c.CrashError, "crash-error", c.CrashError, "crash text: exception, oom, nccl, or abrupt (no text, like SIGKILL)")
	durationVar(fs, &c.HangAt, "hang-after", "fault: the scheduler stops this long after ready")
	fs.IntVar(&c.HangAfterRequests, "hang-after-requests", c.HangAfterRequests, "fault: the scheduler stops once N requests have arrived")
	durationVar(fs, &c.HangFor, "hang-for", "how long a hang lasts (0 = until the watchdog or forever)")
	durationVar(fs, &c.ZombieAt, "zombie-after", "fault: generation dies silently this long after ready (HTTP stays up)")
	fs.IntVar(&c.ZombieAfterRequest, "zombie-after-requests", c.ZombieAfterRequest, "fault: generation dies silently once N requests have arrived")
	fs.Float64Var(&c.SlowFactor, "slow-factor", c.SlowFactor, "fault: multiply step times by this (0 = off)")
	durationVar(fs, &c.SlowAt, "slow-after", "when the slow fault starts, after ready")
	durationVar(fs, &c.SlowFor, "slow-for", "how long the slow fault lasts (0 = forever)")
	fs.IntVar(&c.ErrorCount, "error-count", c.ErrorCount, "fault: this many requests get --error-status")
	fs.IntVar(&c.ErrorStatus, "error-status", c.ErrorStatus, "HTTP status of the error burst: 400-499 (the request is refused, as for a parameter the server rejects) or 500-599")
	fs.StringVar(&c.ErrorMessage, "error-message", c.ErrorMessage, "message of the error burst's answers (default: the status text)")
	fs.IntVar(&c.ErrorAfterRequests, "error-after-requests", c.ErrorAfterRequests, "the error burst starts after N requests")
	fs.IntVar(&c.ResetCount, "reset-count", c.ResetCount, "fault: this many requests get a TCP reset mid-stream")
	fs.IntVar(&c.ResetAfterTokens, "reset-after-tokens", c.ResetAfterTokens, "tokens streamed before the reset")
	fs.IntVar(&c.MalformedCount, "malformed-count", c.MalformedCount, "fault: this many requests get one malformed SSE chunk")
	fs.IntVar(&c.MalformedAfterTok, "malformed-after-tokens", c.MalformedAfterTok, "tokens streamed before the malformed chunk")
	fs.StringVar(&c.CutPrompt, "cut-prompt", c.CutPrompt, "fault: cut the stream of every request whose last user message contains this text (no finish_reason, no [DONE]); others are answered")
	fs.IntVar(&c.CutAfterTokens, "cut-after-tokens", c.CutAfterTokens, "tokens streamed before the cut")
	durationVar(fs, &c.ThrottleAt, "throttle-after", "when the throttle fault starts, after ready")
	durationVar(fs, &c.ThrottleFor, "throttle-for", "fault: refuse generation requests with --throttle-status and a Retry-After for this long (simulated time)")
	fs.IntVar(&c.ThrottleStatus, "throttle-status", c.ThrottleStatus, "status of the throttle's refusals: 429 or 503")
	durationVar(fs, &c.ThrottleRetryAfter, "throttle-retry-after", "Retry-After of the throttle's refusals, in seconds as the client sees them (not scaled by --speed)")
	fs.IntVar(&c.BrokenAfterRequests, "broken-after-requests", c.BrokenAfterRequests, "fault: after N generation requests, answer every one with --broken-status while /health stays healthy (a server broken mid-job)")
	durationVar(fs, &c.BrokenAt, "broken-at", "fault: the same from this long after ready (simulated time)")
	durationVar(fs, &c.BrokenFor, "broken-for", "how long the broken fault lasts (simulated time; 0 = for ever)")
	fs.IntVar(&c.BrokenStatus, "broken-status", c.BrokenStatus, "status of the broken fault's answers: 4xx or 5xx (default 500)")
	fs.StringVar(&c.BrokenMessage, "broken-message", c.BrokenMessage, "message of the broken fault's answers (default: Internal server error)")
	fs.Float64Var(&c.ThrottleProbability, "throttle-probability", c.ThrottleProbability, "share of requests the throttle refuses (0 = all of them; set alone, the throttle lasts for ever)")
	fs.StringVar(&c.Scenario, "scenario", c.Scenario, "YAML file with a list of timed faults")
}

// registerCaptureFlags binds vLLM's hidden-state extraction (capture.go) and its faults.
func registerCaptureFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&c.HiddenStates, "hidden-states", c.HiddenStates, "vllm: write each completion's hidden states to DIR/<request id>.safetensors and return the path in kv_transfer_params, as vLLM's extract_hidden_states method with its hidden-states connector does")
	fs.IntVar(&c.HiddenSize, "hidden-size", c.HiddenSize, "hidden size of the written hidden states")
	fs.IntVar(&c.HiddenLayers, "layers", c.HiddenLayers, "layers per token in the written hidden states")
	fs.StringVar(&c.HiddenDType, "hidden-dtype", c.HiddenDType, "dtype of the written hidden states: bf16, f16 or f32")
	fs.StringVar(&c.HiddenStatesFault, "hidden-states-fault", c.HiddenStatesFault, "fault of the hidden-state files: nan (one element), inf (one element), wrong-ids (one token id in the file), missing (no file at the path), truncated (file cut short), slow (answered before the file is written), wrong-prompt-ids (one id of the answer's prompt_token_ids)")
	fs.IntVar(&c.HiddenStatesFaultEvery, "hidden-states-fault-every", c.HiddenStatesFaultEvery, "the fault hits every Nth capture request (1 = all)")
	durationVar(fs, &c.HiddenStatesSlow, "hidden-states-slow", "slow fault: the file is finished this long after the answer (simulated time)")
	fs.StringVar(&c.RenderSkew, "render-skew", c.RenderSkew, "vllm fault: POST /v1/chat/completions/render answers one id off (the last user message's last id) for requests whose last user message contains this text; generation is unchanged")
}

// Apply sets knobs from a map whose keys are flag names with underscores
// (the job file's server.sim block), e.g. {kv_tokens: 231120, speed: 10}.
func (c *Config) Apply(m map[string]any) error {
	fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
	RegisterFlags(fs, c)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		if fs.Lookup(name) == nil {
			return fmt.Errorf("sim option %q: unknown key", k)
		}
		v, err := flagString(m[k])
		if err != nil {
			return fmt.Errorf("sim option %q: %w", k, err)
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("sim option %q: %w", k, err)
		}
	}
	return nil
}

func flagString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), nil
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	case time.Duration:
		return x.String(), nil
	case nil:
		return "", fmt.Errorf("empty value")
	default:
		return "", fmt.Errorf("value of type %T is not a scalar", v)
	}
}

// durationValue is a time.Duration flag that also takes plain seconds ("2.5").
type durationValue struct{ d *time.Duration }

func durationVar(fs *pflag.FlagSet, d *time.Duration, name, usage string) {
	fs.Var(durationValue{d}, name, usage+" (duration like 2s or seconds)")
}

func (v durationValue) String() string {
	if v.d == nil {
		return "0s"
	}
	return v.d.String()
}
func (v durationValue) Type() string { return "duration" }
func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return d, nil
}

// maxRunning applies SGLang's default rule (resolve_max_num_reqs) when unset.
func (c *Config) maxRunning() int {
	kv := c.kvTokens()
	if c.MaxRunningRequests > 0 {
		return max(1, min(c.MaxRunningRequests, kv/2))
	}
	est := int(float64(kv) / float64(c.ContextLen) * 512)
	est = min(max(est, 2048), 4096)
	return max(1, min(est, kv/2))
}

func (c *Config) kvTokens() int {
	if c.MaxTotalTokens > 0 && c.MaxTotalTokens < c.KVTokens {
		return c.MaxTotalTokens
	}
	return c.KVTokens
}

func (c *Config) modelName() string {
	if c.ModelName != "" {
		return c.ModelName
	}
	return c.ModelPath
}

func (c *Config) validate() error {
	switch {
	case c.Engine != EngineSGLang && c.Engine != EngineVLLM && c.Engine != EngineLlamaCpp:
		return fmt.Errorf("engine %q: want sglang, vllm or llamacpp", c.Engine)
	case c.APIShape != ShapeCurrent && c.APIShape != ShapePrevious:
		return fmt.Errorf("api-shape %q: want current or previous", c.APIShape)
	case c.Slots < 1 || c.DP < 1:
		return fmt.Errorf("parallel %d, dp %d: want at least 1", c.Slots, c.DP)
	case c.KVTokens < 2:
		return fmt.Errorf("kv-tokens %d: want at least 2", c.KVTokens)
	case c.ContextLen < 2:
		return fmt.Errorf("context-length %d: want at least 2", c.ContextLen)
	case !(c.Speed > 0) || math.IsInf(c.Speed, 0):
		return fmt.Errorf("speed %v: want a positive number", c.Speed)
	case c.MaxPrefillTokens < 1:
		return fmt.Errorf("max-prefill-tokens %d: want at least 1", c.MaxPrefillTokens)
	case c.BytesPerToken <= 0:
		return fmt.Errorf("bytes-per-token %v: want a positive number", c.BytesPerToken)
	case c.OutputSigma < 0:
		return fmt.Errorf("output-sigma %v: want >= 0", c.OutputSigma)
	case c.DecodeLogInterval < 1:
		return fmt.Errorf("decode-log-interval %d: want at least 1", c.DecodeLogInterval)
	case c.NewTokenRatioDecaySteps < 1:
		return fmt.Errorf("new-token-ratio-decay-steps %d: want at least 1", c.NewTokenRatioDecaySteps)
	case c.Reasoning != "auto" && c.Reasoning != "always" && c.Reasoning != "never":
		return fmt.Errorf("reasoning %q: want auto, always or never", c.Reasoning)
	case c.ChatTemplate != "" && c.ChatTemplate != TemplateAppendOnly && c.ChatTemplate != TemplateDropReasoning:
		return fmt.Errorf("chat-template %q: want %s or %s", c.ChatTemplate, TemplateAppendOnly, TemplateDropReasoning)
	case c.modelName() == "":
		return fmt.Errorf("served-model-name: empty (set it or --model-path)")
	}
	return c.validateCapture()
}

// priorityRank is a priority's place in the queue: lower goes first.
func (c *Config) priorityRank(p int) int {
	if c.LowPriorityFirst || c.Engine == EngineVLLM {
		return p
	}
	return -p
}

// checkPriority is vLLM's refusal of a priority other than 0 when
// priority scheduling is off; SGLang ignores the field then.
func (c *Config) checkPriority(p *int) string {
	if p == nil || *p == 0 || c.PriorityScheduling || c.Engine != EngineVLLM {
		return ""
	}
	return fmt.Sprintf("Got priority %d but Priority scheduling is not enabled.", *p)
}
