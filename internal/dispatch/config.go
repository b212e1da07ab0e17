package dispatch

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/regen-dev/regen/internal/dispatch/limit"
	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/quality"
	"github.com/regen-dev/regen/internal/store"
)

// Chatter sends one chat completion; llm.Client implements it. onDelta is
// called for every streamed chunk with the tokens it carried.
type Chatter interface {
	Chat(ctx context.Context, req llm.Request, onDelta func(tokens int)) (llm.Result, error)
}

// TokenCounter is a Chatter that can also count a request body's prompt
// tokens with the server's tokenizer (llm.Client.CountTokens); the
// context check of a prompt near the limit uses it when the client has it.
type TokenCounter interface {
	CountTokens(ctx context.Context, path string, chat bool, model string, body json.RawMessage) (int, error)
}

// Endpoint is one server URL and the client that talks to it.
type Endpoint struct {
	URL    string
	Client Chatter
}

// LaneConfig is one lane: its concurrency, its max_tokens and the lane a
// truncated sample escalates to ("" = none).
type LaneConfig struct {
	Name string
	// Concurrency is the lane's fixed limit over all endpoints; ignored
	// when Auto is set.
	Concurrency int
	// Auto gives the lane an adaptive limit per endpoint (limit.Controller)
	// within these bounds.
	Auto       *limit.Bounds
	MaxTokens  int // 0 = the server's default
	EscalateTo string
	// BackupAt is the share of MaxTokens a request must have generated to
	// get a backup in the EscalateTo lane once the store has no more work
	// for either lane (hedge.go); 0 = never.
	BackupAt float64
}

// Config configures a Dispatcher. Zero durations and counts take the defaults
// noted on each field.
type Config struct {
	Store store.Queue
	Owner string // lease owner id, unique per runner process
	Model string

	Lanes []LaneConfig
	// Serve lists the lanes this dispatcher claims from (nil = all of
	// Lanes). Other lanes stay configured as escalation targets for other
	// workers sharing the store to serve.
	Serve     []string
	Endpoints []Endpoint
	// IngestDone, when not nil, is closed once every sample the job will
	// have is in the store; until then an empty queue does not end Run,
	// since more samples are still arriving.
	IngestDone <-chan struct{}
	// Params are generation settings sent with every request.
	Params map[string]json.RawMessage
	// Generation is the job's configuration generation, recorded with
	// every stored answer (store.Provenance).
	Generation int

	// Quality is the reject rules applied to every answer that is not
	// escalated; the zero value rejects nothing. Reasoning says what the
	// job asked of thinking, for the reasoning rule.
	Quality   quality.Rules
	Reasoning quality.Reasoning
	// KeepReasoning keeps earlier answers' reasoning_content in the history
	// sent for later turns (thinking chat templates expect it stripped).
	KeepReasoning bool
	// LaneFor assigns the next turn of a multi-turn sample to a lane from
	// its partition and estimated prompt tokens; nil keeps it in its lane.
	LaneFor func(partition string, promptTokens int) string
	// PoisonAfter stops Run when this many samples in a row are refused
	// with the same bad-request error before any request was accepted, and
	// caps requests in flight at that many until one is; 0 = off.
	PoisonAfter int
	// BrokenStreak turns on the burn guard (burn.go): this many distinct
	// samples in a row failing on an endpoint with the same server error,
	// nothing answered meanwhile, make it broken, and a server error spends
	// an attempt only when it is the sample's own; 0 = off (every server
	// error spends one). Independent of PoisonAfter.
	BrokenStreak int
	// BrokenAfter stops Run with a BrokenError once every endpoint has been
	// broken this long; 0 = never.
	BrokenAfter time.Duration

	MaxAttempts int           // attempts per sample for retryable errors; default 5
	BaseDelay   time.Duration // first retry delay ceiling; default 2s
	MaxDelay    time.Duration // retry delay cap; default 5m

	// Lease is the lease length, extended every Lease/3; default 2m.
	Lease time.Duration
	// DrainTimeout bounds the wait for in-flight requests when Run's context
	// ends; the rest are cancelled and released. Default 30s.
	DrainTimeout time.Duration
	// BreakerCooldown is the first open period of an endpoint's breaker
	// after a server-down error, doubled on each failed probe up to 30s;
	// default 1s.
	BreakerCooldown time.Duration
	// NoAffinity turns off conversation and shared-prefix affinity
	// (affinity.go): every request goes where token-aware balancing puts it.
	NoAffinity bool
	// NoAdmission turns off conversation-level admission (admit.go) while
	// affinity stays on; NoAffinity turns both off.
	NoAdmission bool
	// LimitParams tune the adaptive limits; nil = limit.DefaultParams.
	LimitParams *limit.Params

	// Observe, when set, is told of every finished request (for regen's
	// own metrics); it must not block.
	Observe func(Attempt)

	Logger *slog.Logger
	Now    func() time.Time
}

// applyDefaults fills the zero fields of cfg with their defaults.
func applyDefaults(cfg *Config) {
	setDefault(&cfg.MaxAttempts, 5)
	setDefault(&cfg.BaseDelay, 2*time.Second)
	setDefault(&cfg.MaxDelay, 5*time.Minute)
	setDefault(&cfg.Lease, 2*time.Minute)
	setDefault(&cfg.DrainTimeout, 30*time.Second)
	setDefault(&cfg.BreakerCooldown, time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
}

func setDefault[T int | time.Duration](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
}
