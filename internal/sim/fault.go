package sim

import (
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/goccy/go-yaml"
)

// Fault kinds.
const (
	FaultCrash     = "crash"     // log the crash text, close every connection, exit with ExitCode
	FaultHang      = "hang"      // the scheduler stops for For (0 = forever); the watchdog may crash it
	FaultZombie    = "zombie"    // generation dies silently; HTTP stays up
	FaultSlow      = "slow"      // step times multiplied by Factor for For (0 = forever)
	FaultError     = "error"     // Count requests get Status (4xx or 5xx) with Message
	FaultReset     = "reset"     // Count requests get a TCP reset after Tokens tokens
	FaultMalformed = "malformed" // Count requests get one malformed SSE chunk after Tokens tokens
	FaultCut       = "cut"       // requests whose last user message holds Prompt: Tokens tokens, then the connection is cut
	FaultThrottle  = "throttle"  // requests get Status (429 or 503) with a Retry-After, from At for For, with Probability
	// FaultBroken: from its trigger (At after ready, or after AfterRequests
	// requests) every generation request gets Status (default 500) with
	// Message, for For (0 = for ever), while /health stays healthy: a
	// server that breaks in the middle of a job.
	FaultBroken = "broken"
)

// Fault is one injected failure. Its trigger is the first that is set of
// At, AfterRequests, AfterTokens and KVAbove (with KVFor); none set means
// from the start. All times are simulated time after the server is ready.
type Fault struct {
	Kind          string
	At            time.Duration
	AfterRequests int     // fires once this many generation requests have arrived
	AfterTokens   int     // fires once this many tokens have been streamed
	KVAbove       float64 // fires when KV usage stays >= this share ...
	KVFor         time.Duration
	ExitCode      int    // crash; default 1 (137 for abrupt)
	Error         string // crash text: exception | oom | nccl | abrupt
	For           time.Duration
	Factor        float64 // slow
	Status        int     // error; default 503
	Message       string  // error; default the status text
	Count         int     // error, reset, malformed: requests affected; default 1 (cut: 0 = every one)
	Tokens        int     // reset, malformed, cut: tokens streamed first (cut: default 3)
	Prompt        string  // cut: text the request's last user message contains
	// RetryAfter is a throttle's Retry-After header, in whole seconds as
	// the client sees them: not scaled by Speed. Default 1 s.
	RetryAfter time.Duration
	// Probability is the share of a throttle's requests refused; default 1.
	Probability float64
}

func (f Fault) perRequest() bool {
	return f.Kind == FaultError || f.Kind == FaultReset || f.Kind == FaultMalformed
}

func (f *Fault) normalize() error {
	switch f.Kind {
	case FaultCrash:
		if f.Error == "" {
			f.Error = "exception"
		}
		switch f.Error {
		case "exception", "oom", "nccl", "abrupt":
		default:
			return fmt.Errorf("crash error %q: want exception, oom, nccl or abrupt", f.Error)
		}
		if f.ExitCode == 0 {
			f.ExitCode = 1
			if f.Error == "abrupt" {
				f.ExitCode = 137
			}
		}
	case FaultHang, FaultZombie:
	case FaultSlow:
		if f.Factor <= 0 {
			return fmt.Errorf("slow fault: factor %v must be positive", f.Factor)
		}
	case FaultError:
		if f.Status == 0 {
			f.Status = 503
		}
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("error fault: status %d is not 4xx or 5xx", f.Status)
		}
	case FaultReset, FaultMalformed:
	case FaultCut:
		if f.Prompt == "" {
			return fmt.Errorf("cut fault: prompt is empty (the text whose requests are cut)")
		}
		if f.Tokens == 0 {
			f.Tokens = 3
		}
	case FaultThrottle:
		if err := f.normalizeThrottle(); err != nil {
			return err
		}
	case FaultBroken:
		if f.Status == 0 {
			f.Status = http.StatusInternalServerError
		}
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("broken fault: status %d is not 4xx or 5xx", f.Status)
		}
	default:
		return fmt.Errorf("fault kind %q: want crash, hang, zombie, slow, error, reset, malformed, cut, throttle or broken", f.Kind)
	}
	if f.perRequest() && f.Count == 0 {
		f.Count = 1
	}
	if f.KVAbove < 0 || f.KVAbove > 1 {
		return fmt.Errorf("%s fault: kv_above %v outside [0, 1]", f.Kind, f.KVAbove)
	}
	if f.Count < 0 || f.Tokens < 0 || f.AfterRequests < 0 || f.AfterTokens < 0 {
		return fmt.Errorf("%s fault: negative count", f.Kind)
	}
	return nil
}

// ParseFault builds a Fault from a scenario entry such as
// {kind: crash, after_requests: 100, error: oom, exit_code: 3}.
func ParseFault(m map[string]any) (Fault, error) {
	var f Fault
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := m[k]
		s, err := flagString(v)
		if err != nil {
			return f, fmt.Errorf("key %q: %w", k, err)
		}
		switch k {
		case "kind":
			f.Kind = s
		case "error":
			f.Error = s
		case "message":
			f.Message = s
		case "prompt":
			f.Prompt = s
		case "retry_after":
			f.RetryAfter, err = parseDuration(s)
		case "probability":
			f.Probability, err = atof(s)
		case "at":
			f.At, err = parseDuration(s)
		case "kv_for":
			f.KVFor, err = parseDuration(s)
		case "for":
			f.For, err = parseDuration(s)
		case "after_requests":
			f.AfterRequests, err = atoi(s)
		case "after_tokens":
			f.AfterTokens, err = atoi(s)
		case "exit_code":
			f.ExitCode, err = atoi(s)
		case "status":
			f.Status, err = atoi(s)
		case "count":
			f.Count, err = atoi(s)
		case "tokens":
			f.Tokens, err = atoi(s)
		case "kv_above":
			f.KVAbove, err = atof(s)
		case "factor":
			f.Factor, err = atof(s)
		default:
			return f, fmt.Errorf("unknown key %q", k)
		}
		if err != nil {
			return f, fmt.Errorf("key %q: %w", k, err)
		}
	}
	if err := f.normalize(); err != nil {
		return f, err
	}
	return f, nil
}

// LoadScenario reads a YAML list of faults.
func LoadScenario(path string) ([]Fault, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	var raw []map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	out := make([]Fault, 0, len(raw))
	for i, m := range raw {
		f, err := ParseFault(m)
		if err != nil {
			return nil, fmt.Errorf("scenario %s fault %d: %w", path, i+1, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// faults gathers the flag shortcuts, the scenario file and c.Faults.
func (c *Config) faults() ([]Fault, error) {
	var out []Fault
	add := func(f Fault) error {
		if err := f.normalize(); err != nil {
			return err
		}
		out = append(out, f)
		return nil
	}
	if c.CrashAfterRequests > 0 || c.CrashAfterTokens > 0 || c.CrashAt > 0 || c.CrashKVAbove > 0 {
		if err := add(Fault{Kind: FaultCrash, AfterRequests: c.CrashAfterRequests, AfterTokens: c.CrashAfterTokens,
			At: c.CrashAt, KVAbove: c.CrashKVAbove, KVFor: c.CrashKVFor, ExitCode: c.CrashExitCode, Error: c.CrashError}); err != nil {
			return nil, err
		}
	}
	if c.HangAt > 0 || c.HangAfterRequests > 0 {
		if err := add(Fault{Kind: FaultHang, At: c.HangAt, AfterRequests: c.HangAfterRequests, For: c.HangFor}); err != nil {
			return nil, err
		}
	}
	if c.ZombieAt > 0 || c.ZombieAfterRequest > 0 {
		if err := add(Fault{Kind: FaultZombie, At: c.ZombieAt, AfterRequests: c.ZombieAfterRequest}); err != nil {
			return nil, err
		}
	}
	if c.SlowFactor > 0 {
		if err := add(Fault{Kind: FaultSlow, Factor: c.SlowFactor, At: c.SlowAt, For: c.SlowFor}); err != nil {
			return nil, err
		}
	}
	if c.ErrorCount > 0 {
		if err := add(Fault{Kind: FaultError, Count: c.ErrorCount, Status: c.ErrorStatus, Message: c.ErrorMessage, AfterRequests: c.ErrorAfterRequests}); err != nil {
			return nil, err
		}
	}
	if c.ResetCount > 0 {
		if err := add(Fault{Kind: FaultReset, Count: c.ResetCount, Tokens: c.ResetAfterTokens}); err != nil {
			return nil, err
		}
	}
	if c.MalformedCount > 0 {
		if err := add(Fault{Kind: FaultMalformed, Count: c.MalformedCount, Tokens: c.MalformedAfterTok}); err != nil {
			return nil, err
		}
	}
	if c.CutPrompt != "" {
		if err := add(Fault{Kind: FaultCut, Prompt: c.CutPrompt, Tokens: c.CutAfterTokens}); err != nil {
			return nil, err
		}
	}
	if c.ThrottleFor > 0 || c.ThrottleProbability > 0 {
		if err := add(Fault{Kind: FaultThrottle, At: c.ThrottleAt, For: c.ThrottleFor, Status: c.ThrottleStatus,
			RetryAfter: c.ThrottleRetryAfter, Probability: c.ThrottleProbability}); err != nil {
			return nil, err
		}
	}
	if c.BrokenAfterRequests > 0 || c.BrokenAt > 0 {
		if err := add(Fault{Kind: FaultBroken, AfterRequests: c.BrokenAfterRequests, At: c.BrokenAt, For: c.BrokenFor,
			Status: c.BrokenStatus, Message: c.BrokenMessage}); err != nil {
			return nil, err
		}
	}
	if c.Scenario != "" {
		fs, err := LoadScenario(c.Scenario)
		if err != nil {
			return nil, err
		}
		out = append(out, fs...)
	}
	for i, f := range c.Faults {
		if err := add(f); err != nil {
			return nil, fmt.Errorf("fault %d: %w", i+1, err)
		}
	}
	return out, nil
}

// faultState is a fault at run time.
type faultState struct {
	Fault
	fired     atomic.Bool
	firedAt   atomic.Int64 // sim nanoseconds since start
	remaining atomic.Int64 // per-request faults: requests still to affect
	kvSince   time.Duration
	kvHigh    bool
}

func (f *Fault) normalizeThrottle() error {
	if f.Status == 0 {
		f.Status = http.StatusTooManyRequests
	}
	if f.Status != http.StatusTooManyRequests && f.Status != http.StatusServiceUnavailable {
		return fmt.Errorf("throttle fault: status %d, want 429 or 503", f.Status)
	}
	if f.RetryAfter == 0 {
		f.RetryAfter = time.Second
	}
	if f.Probability == 0 {
		f.Probability = 1
	}
	if f.AfterRequests > 0 || f.AfterTokens > 0 || f.KVAbove > 0 {
		return fmt.Errorf("throttle fault: it starts at `at` (and lasts `for`), not on a count or KV usage")
	}
	if !(f.Probability > 0 && f.Probability <= 1) {
		return fmt.Errorf("throttle fault: probability %v outside (0, 1]", f.Probability)
	}
	return nil
}

func atoi(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("not an integer: %q", s)
	}
	return n, nil
}

func atof(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	return f, nil
}
