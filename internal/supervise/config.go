package supervise

import (
	"log/slog"
	"net/http"
	"os/exec"
	"time"

	"github.com/regen-dev/regen/internal/engine"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/probe"
)

// Defaults for zero Config and job.Server fields; those a job file can set
// are the job's own defaults, so the two never disagree.
const (
	DefaultHangTimeout       = job.DefaultHangTimeout
	DefaultStallTimeout      = 2 * time.Minute
	DefaultProbeEvery        = 5 * time.Second
	DefaultProbeFailures     = 3
	DefaultPollEvery         = 250 * time.Millisecond
	DefaultReadyTimeout      = job.DefaultReadyTimeout
	DefaultReadyPollEvery    = 500 * time.Millisecond
	DefaultKillGrace         = 15 * time.Second
	DefaultFatalGrace        = 5 * time.Second
	DefaultChildMinAge       = 10 * time.Second
	DefaultGPUReleaseTimeout = 2 * time.Minute
	DefaultRestartMax        = job.DefaultRestartMax
	DefaultRestartWindow     = job.DefaultRestartWindow
	DefaultRestartBackoff    = job.DefaultRestartBackoff
	DefaultMaxBackoff        = 5 * time.Minute
	DefaultLogMaxBytes       = 64 << 20
	DefaultLogKeep           = 3
	DefaultRetractsPerMinute = 6
)

// Config configures a Supervisor. Zero durations and counts take the
// Default* values above; Server.HangTimeout, Server.ReadyTimeout and
// Server.Restart are read from the job.
type Config struct {
	Server  job.Server
	Model   string
	Dialect engine.Dialect
	// Dir is the server's working directory ("" = regen's).
	Dir string
	// LogPath receives the server's stdout and stderr ("" = not kept).
	LogPath     string
	LogMaxBytes int64 // rotate when a write would pass this size
	LogKeep     int   // rotated files kept: LogPath.1 ... LogPath.N
	Logger      *slog.Logger

	// OnState is called on every state change, always from the goroutine
	// that called Run, before the supervisor acts on the change (so the
	// dispatcher is paused before the group is killed). It must not block long.
	OnState func(Status)
	// Progress returns the dispatcher's evidence of token flow for this
	// server: requests in flight and when the last token arrived.
	Progress func() (inFlight int, lastToken time.Time)
	// OnProbe receives every probe taken after readiness (health and
	// metrics), from Run's goroutine, before the supervisor judges it; the
	// dispatcher's adaptive limits feed on the metrics. It must not block long.
	OnProbe func(probe.Snapshot)

	HangTimeout       time.Duration // in flight, no token: STALLED (default Server.HangTimeout, then 30s)
	StallTimeout      time.Duration // work queued, no generation anywhere: STALLED
	ProbeEvery        time.Duration // health and metrics probe interval after readiness
	ProbeTimeout      time.Duration // one probe request (default the dialect's, 25s)
	ProbeFailures     int           // consecutive failed probes that make STALLED
	PollEvery         time.Duration // /proc scan and deadline checks
	ReadyPollEvery    time.Duration // readiness endpoint polling while STARTING
	KillGrace         time.Duration // SIGTERM to SIGKILL
	FatalGrace        time.Duration // a fatal log line with the process still alive: DOWN after this
	ChildMinAge       time.Duration // a child appearing after readiness is watched once this old
	GPUReleaseTimeout time.Duration
	MaxBackoff        time.Duration
	RetractsPerMinute int // retractions per minute that make DEGRADED
	// NvidiaSMI is the nvidia-smi path: "" looks it up on PATH, "-" disables the GPU wait.
	NvidiaSMI string
	// Client is used for probes (default: a client without overall timeout;
	// each request is bounded by ProbeTimeout).
	Client *http.Client
	Now    func() time.Time

	gpuPoll time.Duration // nvidia-smi polling interval; tests shorten it
	// reapGrace is how long drain waits for the leader's reap beyond
	// KillGrace (default 10s); tests shorten it.
	reapGrace time.Duration
	// reap waits for the launched process (default cmd.Wait); tests replace
	// it to model a leader the kernel never lets go of.
	reap func(*exec.Cmd) error
}

// fill gives cfg's zero durations and counts their Default* values.
func (cfg *Config) fill() {
	if cfg.HangTimeout <= 0 {
		cfg.HangTimeout = cfg.Server.HangTimeout
	}
	def(&cfg.HangTimeout, DefaultHangTimeout)
	def(&cfg.StallTimeout, DefaultStallTimeout)
	def(&cfg.ProbeEvery, DefaultProbeEvery)
	def(&cfg.ProbeTimeout, cfg.Dialect.ProbeTimeout)
	def(&cfg.ProbeTimeout, engine.DefaultProbeTimeout)
	def(&cfg.PollEvery, DefaultPollEvery)
	def(&cfg.ReadyPollEvery, DefaultReadyPollEvery)
	def(&cfg.KillGrace, DefaultKillGrace)
	def(&cfg.FatalGrace, DefaultFatalGrace)
	def(&cfg.ChildMinAge, DefaultChildMinAge)
	def(&cfg.GPUReleaseTimeout, DefaultGPUReleaseTimeout)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	def(&cfg.ProbeFailures, DefaultProbeFailures)
	def(&cfg.RetractsPerMinute, DefaultRetractsPerMinute)
	def(&cfg.LogMaxBytes, DefaultLogMaxBytes)
	def(&cfg.LogKeep, DefaultLogKeep)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Client == nil {
		// Our own transport, so closing its idle connections at the end of
		// Run touches nobody else's.
		cfg.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	cfg.Dialect.ProbeTimeout = cfg.ProbeTimeout

	if cfg.gpuPoll <= 0 {
		cfg.gpuPoll = time.Second
	}
	def(&cfg.reapGrace, 10*time.Second)
	if cfg.reap == nil {
		cfg.reap = (*exec.Cmd).Wait
	}
}

// def sets an unset (zero or negative) setting to its default.
func def[T int | int64 | time.Duration](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
}
