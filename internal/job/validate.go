package job

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Engines regen knows how to talk to (and, for a server, launch).
var Engines = []string{"sglang", "vllm", "llamacpp", "sim"}

// Balance modes (Spec.Balance).
const (
	BalanceAffinity = "affinity"
	BalanceTokens   = "tokens"
	// BalanceAffinityOnly is affinity without conversation-level admission
	// (every endpoint takes new conversations whatever it holds): regen
	// before admission, kept to compare against.
	BalanceAffinityOnly = "affinity-only"
)

// OutputFormats export can write.
var OutputFormats = []string{"sharegpt", "openai-batch", "parquet"}

// reservedParams are request fields regen sets itself; generation.extra
// must not override them.
var reservedParams = []string{"model", "messages", "tools", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n"}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validator collects problems with their lines.
type validator struct {
	s    *Spec
	errs []error
}

func (v *validator) addf(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{
		File:  v.s.Path,
		Line:  v.s.loc.line(path),
		Field: path,
		Msg:   fmt.Sprintf(format, args...),
	})
}

// Validate checks a defaulted Spec and returns every problem joined
// (errors.Join of *FieldError), or nil.
func (s *Spec) Validate() error {
	v := &validator{s: s}
	if strings.TrimSpace(s.Name) == "" {
		v.addf("name", "required")
	}
	v.sources()
	v.lanes()
	v.generation()
	v.endpoints()
	if s.Balance != "" && s.Balance != BalanceAffinity && s.Balance != BalanceTokens && s.Balance != BalanceAffinityOnly {
		v.addf("balance", "%q is not one of %s, %s, %s", s.Balance, BalanceAffinity, BalanceTokens, BalanceAffinityOnly)
	}
	v.store()
	v.output()
	v.retry()
	v.monitor()
	v.training()
	v.capture()
	if s.Alerts.Webhook != "" {
		v.httpURL("alerts.webhook", s.Alerts.Webhook)
	}
	return errors.Join(v.errs...)
}

func (v *validator) sources() {
	s := v.s
	if len(s.Sources) == 0 {
		v.addf("sources", "at least one source is required")
	}
	seen := map[string]int{}
	for i, src := range s.Sources {
		p := fmt.Sprintf("sources[%d]", i)
		switch {
		case strings.TrimSpace(src.Partition) == "":
			v.addf(p+".partition", "required")
		case seen[src.Partition] > 0:
			v.addf(p+".partition", "%q is also the name of sources[%d]", src.Partition, seen[src.Partition]-1)
		default:
			seen[src.Partition] = i + 1
		}
		if src.Path == "" {
			v.addf(p+".path", "required")
		}
		n := 0
		for _, f := range []string{src.Conversations, src.Messages, src.Prompt} {
			if f != "" {
				n++
			}
		}
		if n != 1 {
			v.addf(p, "set exactly one of conversations, messages or prompt (got %d)", n)
		}
		if src.Format != "" && !slices.Contains([]string{"jsonl", "parquet"}, src.Format) {
			v.addf(p+".format", "unknown format %q (want jsonl or parquet (gzip is read by the .gz extension), or leave it out to go by extension)", src.Format)
		}
		if src.Limit < 0 {
			v.addf(p+".limit", "must be >= 0")
		}
		switch {
		case src.SamplesPerPrompt < 1:
			v.addf(p+".samples_per_prompt", "must be >= 1")
		case src.SamplesPerPrompt > 1 && s.Generation.Extra["seed"] != nil:
			// The job's seed would override every sample's own: k identical answers.
			v.addf(p+".samples_per_prompt", "%d answers per prompt need a seed per sample; remove generation.extra.seed", src.SamplesPerPrompt)
		}
		if src.Lane != "" {
			if _, ok := s.Lane(src.Lane); !ok {
				v.addf(p+".lane", "no lane named %q", src.Lane)
			}
		}
	}
}

func (v *validator) lanes() {
	s := v.s
	if len(s.Lanes) == 0 {
		v.addf("lanes", "at least one lane is required (leave lanes out for one default lane)")
	}
	seen := map[string]int{}
	for i, l := range s.Lanes {
		p := fmt.Sprintf("lanes[%d]", i)
		switch {
		case strings.TrimSpace(l.Name) == "":
			v.addf(p+".name", "required")
		case seen[l.Name] > 0:
			v.addf(p+".name", "%q is also the name of lanes[%d]", l.Name, seen[l.Name]-1)
		default:
			seen[l.Name] = i + 1
		}
		for _, pr := range l.problems {
			path := p + ".concurrency"
			if pr.field != "" {
				path += "." + pr.field
			}
			v.addf(path, "%s", pr.msg)
		}
		if l.Auto == nil && l.Concurrency <= 0 && len(l.problems) == 0 {
			v.addf(p+".concurrency", "must be > 0")
		}
		if l.MaxTokens <= 0 {
			v.addf(p+".max_tokens", "must be > 0")
		}
		if l.MaxPromptTokens < 0 {
			v.addf(p+".max_prompt_tokens", "must be >= 0")
		}
		if b := l.BackupAt; b < 0 || b >= 1 {
			v.addf(p+".backup_at", "must be >= 0 and < 1 (a share of max_tokens; 0 = no backups)")
		}
		for j, part := range l.Partitions {
			if !slices.ContainsFunc(s.Sources, func(src Source) bool { return src.Partition == part }) {
				v.addf(fmt.Sprintf("%s.partitions[%d]", p, j), "no source has partition %q", part)
			}
		}
	}
}

func (v *validator) generation() {
	g := v.s.Generation
	if g.Temperature != nil && (*g.Temperature < 0 || *g.Temperature > 2) {
		v.addf("generation.temperature", "must be between 0 and 2")
	}
	if g.TopP != nil && (*g.TopP <= 0 || *g.TopP > 1) {
		v.addf("generation.top_p", "must be > 0 and <= 1")
	}
	if g.RequestTimeout <= 0 {
		v.addf("generation.request_timeout", "must be > 0")
	}
	if g.IdleTimeout <= 0 {
		v.addf("generation.idle_timeout", "must be > 0")
	}
	if g.HeaderTimeout <= 0 {
		v.addf("generation.header_timeout", "must be > 0")
	}
	for _, k := range sortedKeys(g.Extra) {
		switch {
		case slices.Contains(reservedParams, k):
			v.addf("generation.extra."+k, "is set by regen and cannot be overridden")
		case k == "temperature" && g.Temperature != nil,
			k == "top_p" && g.TopP != nil,
			k == "chat_template_kwargs" && g.ChatTemplateKwargs != nil:
			v.addf("generation.extra."+k, "also set as generation.%s; keep one", k)
		}
	}
	if _, err := g.Params(); err != nil {
		v.addf("generation", "%v", err)
	}
}

// endpointURL checks the URL of list[i] (endpoints, capture.endpoints):
// set, not already list[j] (seen maps each URL met to j+1), an http(s)
// server root.
func (v *validator) endpointURL(list string, i int, url string, seen map[string]int) {
	p := fmt.Sprintf("%s[%d].url", list, i)
	switch {
	case url == "":
		v.addf(p, "required")
	case seen[url] > 0:
		v.addf(p, "%s is also %s[%d]", url, list, seen[url]-1)
	default:
		seen[url] = i + 1
		if v.httpURL(p, url) {
			v.serverRoot(p, url)
		}
	}
}

func (v *validator) endpoints() {
	s := v.s
	switch {
	case len(s.Endpoints) == 0 && s.Server == nil:
		v.addf("endpoints", "set endpoints (servers to call) or server (a server regen launches)")
	case len(s.Endpoints) > 0 && s.Server != nil:
		v.addf("endpoints", "set either endpoints or server, not both (with server, the launched server is the endpoint)")
	}
	seen := map[string]int{}
	for i, e := range s.Endpoints {
		p := fmt.Sprintf("endpoints[%d]", i)
		v.endpointURL("endpoints", i, e.URL, seen)
		v.engine(p+".engine", e.Engine)
		if e.KVTokens < 0 {
			v.addf(p+".kv_tokens", "must be >= 0 (0 = take the server's own figure)")
		}
		if e.APIKeyEnv != "" {
			switch {
			case strings.HasPrefix(e.APIKeyEnv, "sk-") || strings.ContainsAny(e.APIKeyEnv, " \t") || len(e.APIKeyEnv) > 64:
				v.addf(p+".api_key_env", "looks like a key, not a variable name: put the key in an environment variable and name the variable here")
			case !envNameRE.MatchString(e.APIKeyEnv):
				v.addf(p+".api_key_env", "%q is not an environment variable name (letters, digits and _)", e.APIKeyEnv)
			}
		}
	}
	if sv := s.Server; sv != nil {
		v.engine("server.engine", sv.Engine)
		if sv.Engine == "sim" {
			if sv.Port < 0 || sv.Port > 65535 {
				v.addf("server.port", "must be 0 (any free port) to 65535")
			}
		} else if sv.Port <= 0 || sv.Port > 65535 {
			v.addf("server.port", "must be 1 to 65535")
		}
		if sv.KVTokens < 0 {
			v.addf("server.kv_tokens", "must be >= 0 (0 = take the server's own figure)")
		}
		if sv.Sim != nil && sv.Engine != "sim" {
			v.addf("server.sim", "only applies to engine: sim")
		}
		if sv.ReadyTimeout <= 0 {
			v.addf("server.ready_timeout", "must be > 0")
		}
		if sv.HangTimeout <= 0 {
			v.addf("server.hang_timeout", "must be > 0")
		}
		if sv.Restart.Max < 0 {
			v.addf("server.restart.max", "must be >= 0")
		}
		if sv.Restart.Window <= 0 {
			v.addf("server.restart.window", "must be > 0")
		}
		if sv.Restart.Backoff <= 0 {
			v.addf("server.restart.backoff", "must be > 0")
		}
	}
}

func (v *validator) engine(path, e string) {
	if !slices.Contains(Engines, e) {
		v.addf(path, "unknown engine %q (want %s)", e, strings.Join(Engines, ", "))
	}
}

// httpURL checks raw is an http(s) URL with a host and reports whether it is.
func (v *validator) httpURL(path, raw string) bool {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		v.addf(path, "not a URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		v.addf(path, "%q: want an http:// or https:// URL", raw)
	case u.Host == "":
		v.addf(path, "%q has no host", raw)
	case u.Port() != "" && !validPort(u.Port()):
		v.addf(path, "%q: port %s is not 1 to 65535", raw, u.Port())
	default:
		return true
	}
	return false
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// serverRoot checks an endpoint URL names a server, not one of its routes:
// regen adds the API paths (and the health and metrics paths its probes use).
func (v *validator) serverRoot(path, raw string) {
	u, _ := url.Parse(raw)
	switch {
	case u.User != nil:
		v.addf(path, "%q carries credentials: put the key in an environment variable and name it in api_key_env", raw)
	case u.RawQuery != "" || u.Fragment != "":
		v.addf(path, "%q: want the server root without ?query or #fragment", raw)
	case strings.Contains(u.Path, "/chat/completions") || strings.HasSuffix(u.Path, "/completions") || strings.HasSuffix(u.Path, "/models"):
		v.addf(path, "%q is an API route: write the server root (%s://%s); regen adds /v1/chat/completions itself", raw, u.Scheme, u.Host)
	}
}

func (v *validator) store() {
	dsn := v.s.Store.DSN
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		u, err := url.Parse(dsn)
		switch {
		case err != nil:
			v.addf("store.dsn", "not a valid postgres:// URL")
		case hasPassword(u):
			// Job files are shared and committed; the password is not shown here either.
			v.addf("store.dsn", "holds a password; put it in PGPASSWORD or a PGPASSFILE (or the whole DSN in REGEN_STORE), never in the job file")
		}
	case strings.Contains(dsn, "://"):
		v.addf("store.dsn", "unknown store %q (want a SQLite file path, sqlite:path or postgres://...)", dsn)
	case dsn == sqlitePrefix:
		v.addf("store.dsn", "sqlite: needs a file path")
	}
}

// hasPassword reports whether a postgres URL carries a password, in its
// user part or as a password query parameter.
func hasPassword(u *url.URL) bool {
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			return true
		}
	}
	for k := range u.Query() {
		if strings.EqualFold(k, "password") {
			return true
		}
	}
	return false
}

func (v *validator) output() {
	seen := map[string]bool{}
	for i, f := range v.s.Output.Formats {
		p := fmt.Sprintf("output.formats[%d]", i)
		switch {
		case !slices.Contains(OutputFormats, f):
			v.addf(p, "unknown format %q (want %s)", f, strings.Join(OutputFormats, ", "))
		case seen[f]:
			v.addf(p, "%q listed twice", f)
		}
		seen[f] = true
	}
}

func (v *validator) retry() {
	r := v.s.Retry
	if r.MaxAttempts < 1 {
		v.addf("retry.max_attempts", "must be >= 1")
	}
	if r.BaseDelay <= 0 {
		v.addf("retry.base_delay", "must be > 0")
	}
	if r.MaxDelay < r.BaseDelay {
		v.addf("retry.max_delay", "must be >= base_delay (%s)", r.BaseDelay)
	}
}

func (v *validator) monitor() {
	m := v.s.Monitor
	if m.HeartbeatEvery <= 0 {
		v.addf("monitor.heartbeat_every", "must be > 0")
	}
	if m.DeadAfter <= m.HeartbeatEvery {
		v.addf("monitor.dead_after", "must be longer than heartbeat_every (%s)", m.HeartbeatEvery)
	}
	if m.HangAfter <= 0 {
		v.addf("monitor.hang_after", "must be > 0")
	}
	if m.StallAfter <= 0 {
		v.addf("monitor.stall_after", "must be > 0")
	}
	if m.ProbeEvery <= 0 {
		v.addf("monitor.probe_every", "must be > 0")
	}
	if m.BrokenAfter < 0 {
		v.addf("monitor.broken_after", "must be >= 0 (0 waits for ever)")
	}
	if m.StartDeadline < 0 {
		v.addf("monitor.start_deadline", "must be >= 0 (0 waits for ever)")
	}
}
