package job

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Defaults for every option a job file may leave out.
const (
	DefaultLaneName    = "default"
	DefaultConcurrency = 64
	DefaultMaxTokens   = 4096
	// DefaultBackupAt: a request past half its max_tokens at the end of the
	// work gets a backup in the lane it would escalate to (measured best of
	// 0.3, 0.5 and 0.7 on bench/sweep's pair workload).
	DefaultBackupAt        = 0.5
	DefaultMaxAttempts     = 5
	DefaultBaseDelay       = 2 * time.Second
	DefaultMaxDelay        = 5 * time.Minute
	DefaultRequestTimeout  = 30 * time.Minute
	DefaultIdleTimeout     = 120 * time.Second
	DefaultHeaderTimeout   = 20 * time.Second
	DefaultBrokenAfter     = 10 * time.Minute
	DefaultStartDeadline   = 30 * time.Minute // as long as a launched server's default ready_timeout: a big model loads for that long
	DefaultEngine          = "sglang"
	DefaultHost            = "127.0.0.1"
	DefaultPort            = 30000
	DefaultReadyTimeout    = 30 * time.Minute
	DefaultSimReadyTimeout = 60 * time.Second
	DefaultHangTimeout     = 30 * time.Second
	DefaultRestartMax      = 5
	DefaultRestartWindow   = 30 * time.Minute
	DefaultRestartBackoff  = 5 * time.Second
	DefaultHeartbeatEvery  = 2 * time.Second
	DefaultDeadAfter       = 15 * time.Second
	DefaultStallAfter      = 60 * time.Second
	DefaultHangAfter       = 30 * time.Second
	DefaultProbeEvery      = 5 * time.Second
	DefaultOutputFormat    = "sharegpt"
	sqlitePrefix           = "sqlite:"
)

// unset reports whether a zero value at path means "not written" (and so
// takes its default) rather than an explicit zero, which validation judges.
func (s *Spec) unset(path string) bool { return !s.loc.has(path) }

func setInt(s *Spec, v *int, path string, def int) {
	if *v == 0 && s.unset(path) {
		*v = def
	}
}

func setDur(s *Spec, v *time.Duration, path string, def time.Duration) {
	if *v == 0 && s.unset(path) {
		*v = def
	}
}

// applyDefaults fills what the file leaves out and makes relative paths
// absolute against Dir, so consumers never depend on the working directory.
func (s *Spec) applyDefaults() {
	if len(s.Lanes) == 0 && s.unset("lanes") {
		s.Lanes = []Lane{{Name: DefaultLaneName}}
	}
	for i := range s.Lanes {
		l := &s.Lanes[i]
		p := fmt.Sprintf("lanes[%d]", i)
		l.resolveConcurrency(s.loc.has(p + ".concurrency"))
		l.checkAuto()
		setInt(s, &l.MaxTokens, p+".max_tokens", DefaultMaxTokens)
		if l.BackupAt == 0 && s.unset(p+".backup_at") {
			l.BackupAt = DefaultBackupAt
		}
	}
	for i := range s.Sources {
		s.Sources[i].Path = s.resolve(s.Sources[i].Path)
		setInt(s, &s.Sources[i].SamplesPerPrompt, fmt.Sprintf("sources[%d].samples_per_prompt", i), 1)
	}

	setInt(s, &s.Retry.MaxAttempts, "retry.max_attempts", DefaultMaxAttempts)
	setDur(s, &s.Retry.BaseDelay, "retry.base_delay", DefaultBaseDelay)
	setDur(s, &s.Retry.MaxDelay, "retry.max_delay", DefaultMaxDelay)

	setDur(s, &s.Generation.RequestTimeout, "generation.request_timeout", DefaultRequestTimeout)
	setDur(s, &s.Generation.IdleTimeout, "generation.idle_timeout", DefaultIdleTimeout)
	setDur(s, &s.Generation.HeaderTimeout, "generation.header_timeout", DefaultHeaderTimeout)

	s.storeDefaults()

	if s.Output.Dir == "" {
		s.Output.Dir = "out"
	}
	s.Output.Dir = s.resolve(s.Output.Dir)
	if len(s.Output.Formats) == 0 {
		s.Output.Formats = []string{DefaultOutputFormat}
	}

	s.serverDefaults()

	setDur(s, &s.Monitor.HeartbeatEvery, "monitor.heartbeat_every", DefaultHeartbeatEvery)
	setDur(s, &s.Monitor.DeadAfter, "monitor.dead_after", DefaultDeadAfter)
	setDur(s, &s.Monitor.StallAfter, "monitor.stall_after", DefaultStallAfter)
	setDur(s, &s.Monitor.HangAfter, "monitor.hang_after", DefaultHangAfter)
	setDur(s, &s.Monitor.ProbeEvery, "monitor.probe_every", DefaultProbeEvery)
	setDur(s, &s.Monitor.BrokenAfter, "monitor.broken_after", DefaultBrokenAfter)
	setDur(s, &s.Monitor.StartDeadline, "monitor.start_deadline", DefaultStartDeadline)
	s.applyTrainingDefaults()
	s.captureDefaults()
}

// storeDefaults names the default SQLite file after the job and resolves
// a SQLite path against Dir.
func (s *Spec) storeDefaults() {
	switch {
	case s.Store.DSN == "":
		s.Store.DSN = filepath.Join(s.Dir, sanitizeName(s.Name)+".db")
	case strings.HasPrefix(s.Store.DSN, sqlitePrefix):
		s.Store.DSN = sqlitePrefix + s.resolve(strings.TrimPrefix(s.Store.DSN, sqlitePrefix))
	case !strings.Contains(s.Store.DSN, "://") && s.Store.DSN != ":memory:":
		s.Store.DSN = s.resolve(s.Store.DSN)
	}
}

// serverDefaults fills the launched server's options, then the endpoints'
// URLs and engines (a launched server's engine is theirs).
func (s *Spec) serverDefaults() {
	if sv := s.Server; sv != nil {
		if sv.Engine == "" {
			sv.Engine = DefaultEngine
		}
		if sv.Host == "" {
			sv.Host = DefaultHost
		}
		if sv.Engine != "sim" {
			setInt(s, &sv.Port, "server.port", DefaultPort)
			setDur(s, &sv.ReadyTimeout, "server.ready_timeout", DefaultReadyTimeout)
		} else {
			setDur(s, &sv.ReadyTimeout, "server.ready_timeout", DefaultSimReadyTimeout)
		}
		setDur(s, &sv.HangTimeout, "server.hang_timeout", DefaultHangTimeout)
		setInt(s, &sv.Restart.Max, "server.restart.max", DefaultRestartMax)
		setDur(s, &sv.Restart.Window, "server.restart.window", DefaultRestartWindow)
		setDur(s, &sv.Restart.Backoff, "server.restart.backoff", DefaultRestartBackoff)
	}
	for i := range s.Endpoints {
		s.Endpoints[i].URL = serverRootURL(s.Endpoints[i].URL)
		if s.Endpoints[i].Engine == "" {
			s.Endpoints[i].Engine = DefaultEngine
			s.Endpoints[i].Detect = s.Server == nil
			if s.Server != nil {
				s.Endpoints[i].Engine = s.Server.Engine
			}
		}
	}
}

// resolve makes p absolute against the job file's directory.
func (s *Spec) resolve(p string) string {
	if p == "" || filepath.IsAbs(p) || s.Dir == "" {
		return p
	}
	return filepath.Join(s.Dir, p)
}

// sanitizeName keeps a job name usable as a file name.
func sanitizeName(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	n := strings.Trim(b.String(), ".")
	if n == "" {
		return "job"
	}
	return n
}

// SQLitePath returns the database file of a SQLite DSN (a plain path or
// "sqlite:path"); ok is false for other backends.
func (st Store) SQLitePath() (path string, ok bool) {
	switch {
	case strings.HasPrefix(st.DSN, sqlitePrefix):
		return strings.TrimPrefix(st.DSN, sqlitePrefix), true
	case strings.Contains(st.DSN, "://"):
		return "", false
	}
	return st.DSN, true
}

// serverRootURL trims url to the server root: regen adds
// /v1/chat/completions, /v1/models, /health and /metrics itself, so a
// copied ".../v1" base works too.
func serverRootURL(url string) string {
	return strings.TrimSuffix(strings.TrimRight(strings.TrimSpace(url), "/"), "/v1")
}
