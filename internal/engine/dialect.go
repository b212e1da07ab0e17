package engine

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/regen-dev/regen/internal/job"
)

// DefaultProbeTimeout bounds one health request. SGLang's /health waits up to
// 20 s (SGLANG_HEALTH_CHECK_TIMEOUT) for the detokenizer before answering 503,
// so a shorter client timeout would report a transport error instead of the
// server's verdict.
const DefaultProbeTimeout = 25 * time.Second

// Engine names accepted by Lookup.
const (
	SGLang   = "sglang"
	VLLM     = "vllm"
	LlamaCpp = "llamacpp"
	Sim      = "sim"
)

// Dialect is everything regen needs to know about one engine kind.
type Dialect struct {
	// Name is the engine name as written in the job file.
	Name string
	// Command is the default executable prefix, replaced by job.Server.Command.
	// Empty for the simulator, whose prefix is this binary plus "sim".
	Command []string
	// ModelFlag precedes the model in argv; "" means the model is positional.
	ModelFlag string
	// Flags are appended after host and port on every launch (metrics on).
	Flags []string

	// ReadyPath answers 200 once the server can generate.
	ReadyPath string
	// ReadyLine, when non-empty, is a log line that also proves readiness.
	ReadyLine string
	// HealthPath is probed periodically after readiness.
	HealthPath string
	// ProbeTimeout bounds one health request (see DefaultProbeTimeout).
	ProbeTimeout time.Duration
	// MetricsPath serves Prometheus text when the server runs with metrics on.
	MetricsPath string
	// LoadsPath answers SGLang's per-DP-rank load and pool (/v1/loads);
	// ServerInfoPaths, tried in order when it does not, answer the server
	// arguments with max_total_num_tokens and, per DP rank,
	// internal_states (/server_info, and /get_server_info before it).
	LoadsPath       string
	ServerInfoPaths []string
	// PropsPath returns llama-server's /props JSON: total_slots and the
	// per-slot context default_generation_settings.n_ctx.
	PropsPath string
	// ModelLimits: /v1/models tells the most tokens a request may hold
	// (vLLM's max_model_len, llama-server's meta.n_ctx).
	ModelLimits bool
	// LoadPath answers {"server_load": N}, the requests the server is
	// working on (vLLM's /load, with --enable-server-load-tracking).
	LoadPath string
	// SlotBound: the server decodes at most its slot count at once and
	// more requests only wait (llama-server): an adaptive limit targets
	// the slots with no queue.
	SlotBound bool
	// RejectsUnknownModel: the server answers 404 to a request whose
	// "model" it does not serve (vLLM). SGLang's and llama-server's
	// OpenAI routes answer any name with the one model they loaded.
	RejectsUnknownModel bool
	// Metrics maps the engine's metric names to the common Metrics fields.
	Metrics MetricNames
	// TokenIDFields are the chat-completion request fields, each set to
	// true, that make the engine return the prompt and completion token ids
	// on a streamed answer; nil when it cannot (docs/engines.md §10).
	TokenIDFields []string
	// Tokenizer is the route that counts a prompt's tokens with the
	// server's own tokenizer, for the "cannot fit the context" check of a
	// prompt near the limit (docs/engines.md §13.3); zero when regen uses
	// none.
	Tokenizer Tokenizer
	// RenderPath renders a chat request into its prompt ids without
	// generating (vLLM's POST /v1/chat/completions/render,
	// docs/engines.md §15.1): the check of each answer's prompt ids, where
	// the server offers it (probed at identification); "" when none.
	RenderPath string
	// VersionPaths, tried in order, answer JSON whose VersionField is the
	// server's version (docs/engines.md §12): SGLang's /server_info (older
	// /get_server_info) version, vLLM's /version, llama-server's /props
	// build_info.
	VersionPaths []string
	VersionField string
}

// Tokenizer is a server's tokenizer route: POST Path with the prompt.
// Chat: it takes the chat request's "messages" and applies the chat
// template, answering the exact prompt count (vLLM's TokenizeChatRequest);
// else it takes {"content": text}, the messages' text alone, whose count is
// a lower bound of the prompt's (llama-server).
type Tokenizer struct {
	Path string
	Chat bool
}

// MetricNames lists, per common field, the engine metric names that feed it;
// the first name present in a scrape wins, so older names go last.
type MetricNames struct {
	Running               []string
	Queued                []string
	TokenUsage            []string
	GenerationTokensTotal []string
	PromptTokensTotal     []string
	RetractionsTotal      []string
	MaxTotalTokens        []string
	// KVPoolInfo names an info gauge whose labels give the KV pool as
	// num_gpu_blocks x block_size (vLLM's cache_config_info).
	KVPoolInfo []string
}

// sglangDialect is SGLang's; the simulator speaks it too (sim: no
// default command, since its prefix is this binary, and no extra flags).
func sglangDialect(name string, command, flags []string) Dialect {
	return Dialect{
		Name:            name,
		Command:         command,
		ModelFlag:       "--model-path",
		Flags:           flags,
		ReadyPath:       "/health_generate",
		ReadyLine:       ReadyLineSGLang,
		HealthPath:      "/health",
		ProbeTimeout:    DefaultProbeTimeout,
		MetricsPath:     "/metrics",
		LoadsPath:       "/v1/loads",
		ServerInfoPaths: sglangServerInfo,
		Metrics:         sglangMetrics,
		TokenIDFields:   sglangTokenIDs,
		VersionPaths:    sglangServerInfo,
		VersionField:    "version",
	}
}

var dialects = map[string]Dialect{
	SGLang: sglangDialect(SGLang, []string{"python3", "-m", "sglang.launch_server"}, []string{"--enable-metrics"}),
	Sim:    sglangDialect(Sim, nil, nil),
	VLLM: {
		Name:                VLLM,
		RejectsUnknownModel: true,
		Command:             []string{"vllm", "serve"},
		ReadyPath:           "/health",
		HealthPath:          "/health",
		ProbeTimeout:        DefaultProbeTimeout,
		MetricsPath:         "/metrics",
		TokenIDFields:       []string{"return_token_ids"},
		Tokenizer:           Tokenizer{Path: "/tokenize", Chat: true},
		RenderPath:          "/v1/chat/completions/render",
		VersionPaths:        []string{"/version"},
		VersionField:        "version",
		ModelLimits:         true,
		LoadPath:            "/load",
		Metrics: MetricNames{
			Running: []string{"vllm:num_requests_running"},
			// by_reason splits the same queue (capacity, deferred); its
			// sum stands in on a build that drops the plain gauge.
			Queued:                []string{"vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason"},
			TokenUsage:            []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
			GenerationTokensTotal: []string{"vllm:generation_tokens_total"},
			PromptTokensTotal:     []string{"vllm:prompt_tokens_total"},
			RetractionsTotal:      []string{"vllm:num_preemptions_total"},
			KVPoolInfo:            []string{"vllm:cache_config_info"},
		},
	},
	LlamaCpp: {
		Name:         LlamaCpp,
		Command:      []string{"llama-server"},
		ModelFlag:    "-m",
		Flags:        []string{"--metrics"},
		ReadyPath:    "/health",
		HealthPath:   "/health",
		ProbeTimeout: DefaultProbeTimeout,
		MetricsPath:  "/metrics",
		PropsPath:    "/props",
		Tokenizer:    Tokenizer{Path: "/tokenize"},
		ModelLimits:  true,
		SlotBound:    true,
		VersionPaths: []string{"/props"},
		VersionField: "build_info",
		Metrics: MetricNames{
			Running:               []string{"llamacpp:requests_processing"},
			Queued:                []string{"llamacpp:requests_deferred"},
			TokenUsage:            []string{"llamacpp:kv_cache_usage_ratio"},
			GenerationTokensTotal: []string{"llamacpp:tokens_predicted_total"},
			PromptTokensTotal:     []string{"llamacpp:prompt_tokens_total"},
		},
	},
}

// sglangTokenIDs ask for SGLang's response-level sglext ids; its older
// return_token_ids is refused on streamed chat completions.
// sglangServerInfo: /server_info replaced /get_server_info, which stays
// as a deprecated alias for a release (docs/engines.md §13.1).
var sglangServerInfo = []string{"/server_info", "/get_server_info"}

var sglangTokenIDs = []string{"return_input_ids_in_sglext", "return_output_ids_in_sglext"}

var sglangMetrics = MetricNames{
	Running:               []string{"sglang:num_running_reqs"},
	Queued:                []string{"sglang:num_queue_reqs"},
	TokenUsage:            []string{"sglang:token_usage"},
	GenerationTokensTotal: []string{"sglang:generation_tokens_total"},
	PromptTokensTotal:     []string{"sglang:prompt_tokens_total"},
	RetractionsTotal:      []string{"sglang:num_retracted_requests_total"},
	MaxTotalTokens:        []string{"sglang:max_total_num_tokens"},
}

// ModelsPath lists the served models, {"data": [{"id": name}, ...]}, on
// every OpenAI-compatible server.
const ModelsPath = "/v1/models"

// Lookup returns the dialect for an engine name; "" means sglang.
func Lookup(name string) (Dialect, error) {
	if name == "" {
		name = SGLang
	}
	d, ok := dialects[strings.ToLower(name)]
	if !ok {
		return Dialect{}, fmt.Errorf("engine %q: unknown (want sglang, vllm, llamacpp or sim)", name)
	}
	d.Command = slices.Clone(d.Command)
	d.Flags = slices.Clone(d.Flags)
	d.TokenIDFields = slices.Clone(d.TokenIDFields)
	d.ServerInfoPaths = slices.Clone(d.ServerInfoPaths)
	d.VersionPaths = slices.Clone(d.VersionPaths)
	return d, nil
}

// Names lists the known engine names, sorted.
func Names() []string {
	names := make([]string, 0, len(dialects))
	for n := range dialects {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LaunchArgs builds the server's argv. The rule is the same for every engine:
//
//	prefix, model, "--host", host, "--port", port, engine flags, s.Sim flags, s.Args
//
// where prefix is s.Command when set and the engine's default otherwise
// (sglang: python3 -m sglang.launch_server; vllm: vllm serve; llamacpp:
// llama-server; sim: this executable plus "sim"); model is ModelFlag followed
// by the model, or the bare model for vllm, and is left out when model is "";
// host defaults to 127.0.0.1. s.Sim entries become --key=value flags (keys
// sorted, underscores turned into dashes) and are used only by the simulator.
// The result is an argument list for exec, never a shell string.
func (d Dialect) LaunchArgs(s job.Server, model string) []string {
	var argv []string
	switch {
	case len(s.Command) > 0:
		argv = append(argv, s.Command...)
	case d.Name == Sim:
		self, err := os.Executable()
		if err != nil {
			self = "regen"
		}
		argv = append(argv, self, "sim")
	default:
		argv = append(argv, d.Command...)
	}
	if model != "" {
		if d.ModelFlag != "" {
			argv = append(argv, d.ModelFlag)
		}
		argv = append(argv, model)
	}
	host := s.Host
	if host == "" {
		host = "127.0.0.1"
	}
	argv = append(argv, "--host", host, "--port", strconv.Itoa(s.Port))
	argv = append(argv, d.Flags...)
	if d.Name == Sim {
		argv = append(argv, simFlags(s.Sim)...)
	}
	return append(argv, s.Args...)
}

func simFlags(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, fmt.Sprintf("--%s=%v", strings.ReplaceAll(k, "_", "-"), m[k]))
	}
	return out
}

// ParseLogLine parses one line of this engine's log; see the package-level
// ParseLogLine, which recognises every engine's lines.
func (d Dialect) ParseLogLine(line string) LogEvent { return ParseLogLine(line) }

// SimAs is the simulator's dialect when it imitates mode (its --engine:
// "" or sglang is Sim itself): the mode's readiness, probes, metrics and
// routes, launched as the simulator.
func SimAs(mode string) (Dialect, error) {
	s, err := Lookup(Sim)
	if mode == "" || strings.EqualFold(mode, SGLang) || err != nil {
		return s, err
	}
	d, err := Lookup(mode)
	if err != nil || d.Name == Sim {
		return s, err
	}
	d.Name, d.Command, d.ModelFlag, d.Flags, d.ReadyLine = s.Name, nil, s.ModelFlag, nil, ""
	return d, nil
}

// TokenIDWarnings lists, for a job that exports token ids
// (output.token_ids), each engine it names that cannot return them on a
// streamed chat completion, at the field that names it. An endpoint left
// for detection is judged when its server answers (fleet), not here.
func TokenIDWarnings(s *job.Spec) []*job.FieldError {
	if !s.Output.TokenIDs {
		return nil
	}
	var out []*job.FieldError
	warn := func(field string, d Dialect) {
		if d.TokenIDFields == nil {
			out = append(out, s.FieldErrorf(field, "warning: %s cannot return token ids on streamed chat completions; with output.token_ids its records export token_ids: unavailable (sglang and vllm return them)", d.Name))
		}
	}
	for i, e := range s.Endpoints {
		if d, err := Lookup(e.Engine); e.Engine != "" && err == nil {
			warn(fmt.Sprintf("endpoints[%d].engine", i), d)
		}
	}
	if srv := s.Server; srv != nil {
		d, err := Lookup(srv.Engine)
		if srv.Engine == Sim {
			mode, _ := srv.Sim["engine"].(string)
			d, err = SimAs(mode)
			d.Name = cmp.Or(mode, Sim)
		}
		if err == nil {
			warn("server.engine", d)
		}
	}
	return out
}
