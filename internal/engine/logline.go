package engine

import (
	"regexp"
	"strconv"
	"strings"
)

// ReadyLineSGLang is logged by SGLang (and the simulator) after warm-up.
const ReadyLineSGLang = "The server is fired up and ready to roll!"

// Kind classifies a log line.
type Kind int

// Log line kinds.
const (
	None     Kind = iota // nothing regen acts on
	Batch                // batch statistics (SGLang Prefill/Decode, vLLM engine stats)
	Retract              // KV cache full, requests retracted: a capacity signal, not fatal
	Ready                // the server finished warm-up
	Fatal                // a crash signature; Cause names it
	Capacity             // the KV pool size (max_total_num_tokens=N)
)

func (k Kind) String() string {
	switch k {
	case Batch:
		return "batch"
	case Retract:
		return "retract"
	case Ready:
		return "ready"
	case Fatal:
		return "fatal"
	case Capacity:
		return "capacity"
	}
	return "none"
}

// Crash causes named by fatal log lines.
const (
	CauseCUDAOOM            = "cuda_oom"
	CauseNCCL               = "nccl"
	CauseCUDAError          = "cuda_error"
	CauseWatchdog           = "watchdog"
	CauseAssert             = "assert"
	CauseAbort              = "abort"
	CauseSchedulerException = "scheduler_exception"
	CauseEngineDead         = "engine_dead"
	CauseInitFailed         = "init_failed"
	CauseLoadFailed         = "load_failed"
	CauseHealthCheckFailed  = "health_check_failed"
	CauseChildFailed        = "child_failed"
)

// LogEvent is what one log line says. Numeric fields are -1 when the line
// does not carry them.
type LogEvent struct {
	Kind Kind
	// Phase is "prefill" or "decode" for SGLang batch lines, "stats" for vLLM's.
	Phase string
	// Fields holds a batch line's raw "key: value" pairs (keys as logged,
	// e.g. "#running-req", "token usage", "gen throughput (token/s)").
	Fields        map[string]string
	Running       int
	Queued        int
	Tokens        int
	TokenUsage    float64 // 0..1
	GenThroughput float64 // tokens/s
	Retracted     int
	// MaxTotalTokens is the KV pool size of a Capacity line.
	MaxTotalTokens int64
	// Cause names a Fatal line's signature (the Cause* constants).
	Cause string
}

type signature struct {
	all   []string // every substring must occur
	cause string
}

// fatalSignatures is checked in order; the more specific causes come first
// because one crash prints several lines (a scheduler exception whose
// traceback ends in a CUDA OOM, then the parent's SIGQUIT line).
var fatalSignatures = []signature{
	{[]string{"CUDA out of memory"}, CauseCUDAOOM},
	{[]string{"OutOfMemoryError"}, CauseCUDAOOM},
	{[]string{"CUDA error: out of memory"}, CauseCUDAOOM},
	{[]string{"cudaMalloc failed: out of memory"}, CauseCUDAOOM},
	{[]string{"NCCL error"}, CauseNCCL},
	{[]string{"Watchdog caught collective operation timeout"}, CauseNCCL},
	{[]string{"we are taking the entire process down"}, CauseNCCL},
	{[]string{"Watchdog timeout ("}, CauseWatchdog},
	{[]string{"watchdog timeout ("}, CauseWatchdog},
	{[]string{"CUDA error:"}, CauseCUDAError},
	{[]string{"GGML_ASSERT(", ") failed"}, CauseAssert},
	{[]string{"terminate called after throwing"}, CauseAbort},
	{[]string{"Scheduler hit an exception"}, CauseSchedulerException},
	{[]string{"DataParallelController hit an exception"}, CauseSchedulerException},
	{[]string{"EngineCore encountered a fatal error"}, CauseEngineDead},
	{[]string{"EngineDeadError"}, CauseEngineDead},
	{[]string{"Engine core proc", "died unexpectedly"}, CauseEngineDead},
	{[]string{"WorkerProc hit an exception"}, CauseEngineDead},
	{[]string{"EngineCore failed to start"}, CauseInitFailed},
	{[]string{"Engine core initialization failed"}, CauseInitFailed},
	{[]string{"Initialization failed."}, CauseInitFailed},
	{[]string{"exiting due to model loading error"}, CauseLoadFailed},
	{[]string{"Health check failed."}, CauseHealthCheckFailed},
	{[]string{"Received sigquit from a child process"}, CauseChildFailed},
	{[]string{"SIGQUIT received"}, CauseChildFailed},
	{[]string{"Child process unexpectedly failed"}, CauseChildFailed},
}

var causePriority = map[string]int{
	CauseCUDAOOM:            5,
	CauseNCCL:               5,
	CauseWatchdog:           4,
	CauseCUDAError:          4,
	CauseAssert:             4,
	CauseAbort:              3,
	CauseSchedulerException: 3,
	CauseEngineDead:         3,
	CauseLoadFailed:         3,
	CauseInitFailed:         2,
	CauseHealthCheckFailed:  2,
	CauseChildFailed:        1,
}

// CausePriority ranks causes so a watcher keeps the root cause of a crash
// rather than its echo: a CUDA OOM outranks the scheduler exception that
// carried it, which outranks the parent's SIGQUIT line. Unknown causes
// (such as a supervisor's own "exit") rank 0.
func CausePriority(cause string) int { return causePriority[cause] }

var (
	batchRe    = regexp.MustCompile(`(Prefill|Decode) batch(?: \[\d+\])?[.,] `)
	capacityRe = regexp.MustCompile(`max_total_num_tokens=(\d+)`)
	vllmRe     = regexp.MustCompile(`Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%`)
)

// ParseLogLine classifies one log line of any supported engine. It is cheap
// on lines that match nothing, which are the vast majority.
func ParseLogLine(line string) LogEvent {
	ev := LogEvent{Running: -1, Queued: -1, Tokens: -1, TokenUsage: -1, GenThroughput: -1, Retracted: -1, MaxTotalTokens: -1}
	line = strings.TrimRight(line, "\r\n")
	if strings.Contains(line, " batch") {
		if loc := batchRe.FindStringSubmatchIndex(line); loc != nil {
			ev.Kind = Batch
			ev.Phase = strings.ToLower(line[loc[2]:loc[3]])
			ev.Fields = keyValues(line[loc[1]:])
			ev.Running = atoi(ev.Fields["#running-req"])
			ev.Queued = atoi(ev.Fields["#queue-req"])
			ev.Tokens = atoi(ev.Fields["#token"])
			ev.TokenUsage = atof(ev.Fields["token usage"])
			ev.GenThroughput = atof(ev.Fields["gen throughput (token/s)"])
			return ev
		}
	}
	if strings.Contains(line, "KV cache pool is full. Retract requests.") {
		ev.Kind = Retract
		_, rest, _ := strings.Cut(line, "Retract requests.")
		ev.Fields = keyValues(strings.TrimSpace(rest))
		ev.Retracted = atoi(ev.Fields["#retracted_reqs"])
		return ev
	}
	if strings.Contains(line, ReadyLineSGLang) {
		ev.Kind = Ready
		return ev
	}
	for _, sig := range fatalSignatures {
		if containsAll(line, sig.all) {
			ev.Kind = Fatal
			ev.Cause = sig.cause
			return ev
		}
	}
	if strings.Contains(line, "Avg generation throughput") {
		if m := vllmRe.FindStringSubmatch(line); m != nil {
			ev.Kind = Batch
			ev.Phase = "stats"
			ev.GenThroughput = atof(m[1])
			ev.Running = atoi(m[2])
			ev.Queued = atoi(m[3])
			if u := atof(m[4]); u >= 0 {
				ev.TokenUsage = u / 100
			}
			return ev
		}
	}
	if strings.Contains(line, "max_total_num_tokens=") {
		if m := capacityRe.FindStringSubmatch(line); m != nil {
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil {
				ev.Kind = Capacity
				ev.MaxTotalTokens = n
				return ev
			}
		}
	}
	return ev
}

// keyValues splits "k: v, k2: v2, " into a map; segments without ": " are skipped.
func keyValues(s string) map[string]string {
	out := make(map[string]string)
	for _, part := range strings.Split(s, ", ") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), ": ")
		if !ok || k == "" {
			continue
		}
		out[k] = strings.TrimSuffix(strings.TrimSpace(v), ",")
	}
	return out
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func atof(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return -1
	}
	return f
}
