package job

import (
	"time"
)

// Spec is a parsed, defaulted and validated job file.
type Spec struct {
	Name    string   `yaml:"name"`
	Model   string   `yaml:"model"`
	Sources []Source `yaml:"sources"`
	Lanes   []Lane   `yaml:"lanes"`
	// Generation settings passed through to every request (temperature,
	// top_p, chat_template_kwargs, any extra JSON the server accepts).
	Generation Generation `yaml:"generation"`
	Endpoints  []Endpoint `yaml:"endpoints"`
	// Balance is how requests are spread over endpoints: "affinity" (the
	// default: a conversation's next turn goes where its previous turn
	// was answered, and rows sharing a long system prompt and tool list
	// meet on one endpoint, while loads stay balanced, and each endpoint
	// holds no more conversations than its KV pool keeps warm),
	// "affinity-only" (the same without that admission) or "tokens" (each
	// request to the endpoint whose KV pool would be least full).
	Balance string  `yaml:"balance"`
	Server  *Server `yaml:"server"`
	Store   Store   `yaml:"store"`
	Output  Output  `yaml:"output"`
	Retry   Retry   `yaml:"retry"`
	Quality Quality `yaml:"quality"`
	Alerts  Alerts  `yaml:"alerts"`
	Monitor Monitor `yaml:"monitor"`
	// Capture is hidden-state capture after generation; nil = none.
	Capture *Capture `yaml:"capture"`

	// Path is the job file's path; Dir its directory. Relative paths in the
	// spec are resolved against Dir. Set by Load, not read from YAML.
	Path string `yaml:"-"`
	Dir  string `yaml:"-"`

	// loc maps field paths to lines of the file for validation errors;
	// nil for a Spec built in code.
	loc *locator
}

// Source is one partition: a file, glob or directory mapped to prompts.
type Source struct {
	Partition string `yaml:"partition"`
	Path      string `yaml:"path"`   // file, glob or directory (relative to the job file)
	Format    string `yaml:"format"` // jsonl | parquet; "" = by extension
	// Mapping names the fields; exactly one of Conversations, Messages or Prompt is set.
	Conversations string `yaml:"conversations"` // ShareGPT field, e.g. "conversations"
	Messages      string `yaml:"messages"`      // OpenAI messages field, e.g. "messages"
	Prompt        string `yaml:"prompt"`        // plain prompt field
	System        string `yaml:"system"`        // optional system prompt text (literal)
	SystemField   string `yaml:"system_field"`  // optional field holding a system prompt
	Tools         string `yaml:"tools"`         // optional field holding OpenAI tools (array or JSON string)
	ID            string `yaml:"id"`            // optional id field
	Limit         int    `yaml:"limit"`         // 0 = all rows
	Lane          string `yaml:"lane"`          // optional: all samples of this partition go to this lane
	// Preset fills the mapping of a known dataset layout (PresetGlaive);
	// fields written in the file win over it.
	Preset string `yaml:"preset"`
	// Regenerate is which assistant turns are regenerated: all (each in
	// order, conditioned on the ones regenerated before it) or last.
	Regenerate string `yaml:"regenerate"`
	// StripSystemPrefix is a literal prefix removed from system prompts
	// (a dataset artefact such as glaive's "SYSTEM: ").
	StripSystemPrefix string `yaml:"strip_system_prefix"`
	// SamplesPerPrompt is how many answers each prompt gets (default 1).
	// With k > 1 a row becomes k samples, "<id>#0" .. "<id>#<k-1>", each
	// sending its own seed (derived from its id) to the server.
	SamplesPerPrompt int `yaml:"samples_per_prompt"`
}

// Lane is a class of requests with its own concurrency and max_tokens.
// The job file's concurrency is a number (a fixed limit for the lane over all
// endpoints), auto, or {auto: true, min, max, initial} (see Auto).
type Lane struct {
	Name string `yaml:"name"`
	// Concurrency is the fixed in-flight limit; 0 when Auto is set.
	Concurrency int `yaml:"-"`
	// Auto replaces the fixed limit with an adaptive one per endpoint.
	Auto *Auto `yaml:"-"`
	// Written is the concurrency as the file has it, resolved into
	// Concurrency or Auto by applyDefaults.
	Written   ConcurrencyValue `yaml:"concurrency"`
	MaxTokens int              `yaml:"max_tokens"`
	// Assignment: partitions listed here go to this lane; otherwise samples
	// whose estimated prompt tokens are <= MaxPromptTokens; the first lane
	// matching wins, and a lane with neither rule is the default.
	Partitions      []string `yaml:"partitions"`
	MaxPromptTokens int      `yaml:"max_prompt_tokens"`
	// BackupAt is the share of MaxTokens after which a request of a lane
	// that escalates gets a backup in the next lane, once no work of
	// either lane waits in the store (0 = never); default DefaultBackupAt.
	BackupAt float64 `yaml:"backup_at"`

	problems []concurrencyProblem // found while resolving, reported by Validate
}

// Generation holds sampling settings passed through to the server.
type Generation struct {
	Temperature        *float64       `yaml:"temperature"`
	TopP               *float64       `yaml:"top_p"`
	ChatTemplateKwargs map[string]any `yaml:"chat_template_kwargs"`
	Extra              map[string]any `yaml:"extra"` // merged at the top level of the request body
	RequestTimeout     time.Duration  `yaml:"request_timeout"`
	IdleTimeout        time.Duration  `yaml:"idle_timeout"` // no bytes on the stream for this long = hang
	// HeaderTimeout bounds the wait for a response's headers: engines send
	// them at once, even for a queued request, so a server that accepts a
	// connection and says nothing for this long does not answer at all.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// Reasoning is what happens to thinking: keep (in the output and in the
	// history sent for later turns), strip_history (in the output only) or
	// disable (turned off through chat_template_kwargs).
	Reasoning string `yaml:"reasoning"`
}

// Endpoint is one OpenAI-compatible server URL.
type Endpoint struct {
	URL       string `yaml:"url"`
	APIKeyEnv string `yaml:"api_key_env"` // name of the env var holding the key; never the key itself
	Engine    string `yaml:"engine"`      // sglang | vllm | llamacpp | sim; default from Server, else detected
	// Detect: the job names no engine here and launches no server, so
	// regen asks the server what it is once it answers (Engine holds the
	// default, sglang, until then).
	Detect bool `yaml:"-"`
	// KVTokens is the server's KV pool in tokens, for token-aware
	// balancing until the server reports its own (0 = wait for that).
	KVTokens int `yaml:"kv_tokens"`
}

// Server is a server regen launches and supervises.
type Server struct {
	Engine       string            `yaml:"engine"`  // sglang | vllm | llamacpp | sim
	Command      []string          `yaml:"command"` // executable and args; default from the engine
	Args         []string          `yaml:"args"`    // extra args appended to the engine's defaults
	Host         string            `yaml:"host"`    // default 127.0.0.1
	Port         int               `yaml:"port"`    // default 30000 (0 for sim = any free port)
	Env          map[string]string `yaml:"env"`
	ReadyTimeout time.Duration     `yaml:"ready_timeout"`
	HangTimeout  time.Duration     `yaml:"hang_timeout"` // no token for this long with requests in flight = STALLED
	Restart      Restart           `yaml:"restart"`
	// KVTokens is the server's predicted KV pool in tokens (regen plan
	// prints it), for token-aware balancing until the server reports its
	// own; 0 = wait for that.
	KVTokens int `yaml:"kv_tokens"`
	// Sim holds flags for the built-in simulator (engine: sim), e.g. {kv_tokens: 231120, speed: 10}.
	Sim map[string]any `yaml:"sim"`
}

// Restart is the server restart policy.
type Restart struct {
	Max     int           `yaml:"max"`     // the Max-th failure within Window makes the server FAILED
	Window  time.Duration `yaml:"window"`  // default 30m
	Backoff time.Duration `yaml:"backoff"` // first delay, doubled each time, capped at 5m
}

// Store selects the durable backend.
type Store struct {
	DSN string `yaml:"dsn"` // default: sqlite file next to the job file (<name>.db)
}

// Output is where export writes.
type Output struct {
	Dir     string   `yaml:"dir"`     // default: <job dir>/out
	Formats []string `yaml:"formats"` // sharegpt | openai-batch | parquet; default [sharegpt]
	// Metadata is what run details training records carry: minimal (none)
	// or full (lanes, finish reasons, usage, endpoints, attempts).
	Metadata string `yaml:"metadata"`
	// TokenIDs asks each server for the prompt and completion token ids
	// (engines that can give them on streamed chat completions: vLLM and
	// SGLang) and exports input_ids and loss_mask per conversation.
	TokenIDs bool `yaml:"token_ids"`
	// TrainTruncated writes answers cut at max_tokens (done when the
	// truncated rule is off) into the training files; by default they go
	// to a file of their own beside them (trainers ignore the flag).
	TrainTruncated bool `yaml:"train_truncated"`
	// TokenRows is what one training row with token ids holds:
	// conversation (the whole conversation, ids only where every later
	// prompt starts with the earlier prompt and answer as generated) or
	// turn (one row per assistant turn: its prompt ids, then its
	// completion ids). It changes the export only, never a request.
	TokenRows string `yaml:"token_rows"`
	// Trainer is the drafter trainer the training files are laid out for:
	// "" (the layout SpecForge and speculators both read where they
	// agree), speculators or specforge (TrainerSpecForge: one row per
	// assistant turn in SpecForge's own row shape). See trainer.go.
	Trainer string `yaml:"trainer"`
	// The dataset card's Hugging Face metadata: License is a Hub license
	// id (unset: "other", and the card says no license was given);
	// Language the ISO 639 codes of the data; PrettyName the card's title
	// (default: the job's name); SourceDatasets the Hub ids of the
	// datasets the sources come from.
	License        string   `yaml:"license"`
	Language       []string `yaml:"language"`
	PrettyName     string   `yaml:"pretty_name"`
	SourceDatasets []string `yaml:"source_datasets"`
}

// Retry is the per-sample retry policy for retryable errors.
type Retry struct {
	MaxAttempts int           `yaml:"max_attempts"` // default 5
	BaseDelay   time.Duration `yaml:"base_delay"`   // default 2s
	MaxDelay    time.Duration `yaml:"max_delay"`    // default 5m
	// PoisonAfter stops dispatch when this many samples in a row are refused
	// with the same bad-request error before any request was accepted (a
	// generation setting the server rejects); 0 = never.
	PoisonAfter int `yaml:"poison_after"`
	// BrokenStreak is the burn guard: this many distinct samples in a row
	// failing on an endpoint with the same server error (5xx, an answer
	// that is not the API) while nothing succeeds there make the endpoint
	// broken, and such errors spend no attempt unless they are the
	// sample's own; default 10, 0 = off (every server error spends one).
	BrokenStreak int `yaml:"broken_streak"`
}

// Alerts are fired on every state change into or out of STALLED, DOWN, FAILED, DEAD.
type Alerts struct {
	Command []string `yaml:"command"`
	Webhook string   `yaml:"webhook"`
}

// Monitor holds liveness deadlines.
type Monitor struct {
	HeartbeatEvery time.Duration `yaml:"heartbeat_every"` // default 2s
	DeadAfter      time.Duration `yaml:"dead_after"`      // heartbeat older than this = DEAD; default 15s
	StallAfter     time.Duration `yaml:"stall_after"`     // no finished sample/token with work queued = STALLED; default 60s
	// HangAfter: an endpoint regen did not launch (endpoints:) with requests
	// in flight and no token for this long is STALLED; default 30s. A
	// launched server uses server.hang_timeout.
	HangAfter time.Duration `yaml:"hang_after"`
	// ProbeEvery is how often each endpoint's health and metrics are read
	// (and so how often concurrency: auto decides); default 5s.
	ProbeEvery time.Duration `yaml:"probe_every"`
	// BrokenAfter stops the run (exit 1, unfinished samples pending) once
	// every endpoint has been broken this long: paused because many
	// samples in a row failed there with the same server error while
	// nothing succeeded. 0 = wait for ever.
	BrokenAfter time.Duration `yaml:"broken_after"`
	// StartDeadline stops the run when no endpoint has answered a request
	// or a health probe this long after the run started (a launched
	// server's own start-up, server.ready_timeout, is not counted).
	// 0 = wait for ever.
	StartDeadline time.Duration `yaml:"start_deadline"`
}
