package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/regen-dev/regen/bench/internal/bound"
	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/reply"
	"github.com/regen-dev/regen/internal/runner"
	"github.com/regen-dev/regen/internal/sim"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// env is what every cell shares.
type env struct {
	dir            string // scratch directory
	prompts        string // the prompts file
	conversations  string // the multi-turn conversations file
	long           string // the long conversations file (mtlong)
	longN          int    // conversations in it
	samples        int
	conversationsN int // conversations in it
	speed          float64
	probe          time.Duration // monitor.probe_every, real time
	regenBin       string        // for supervised servers
	streamInterval int
	priority       bool   // the multi-turn workloads' servers schedule by priority
	profile        string // the simulators' step times (regen sim --profile)
	verbose        bool
	logWriter      io.Writer
}

// result is one cell's measurement.
type result struct {
	Setting     setting
	Tokens      int64   // completion tokens stored
	SimSeconds  float64 // simulated duration of the job
	Sim95       float64 // simulated time until 95% of the tokens were generated
	Wall        time.Duration
	EffSpeed    float64 // the simulators' simulated seconds per real second, over the span their time was counted in
	Retractions float64
	Crashes     int
	PerEndpoint []endpointShare
	Limits      []string // final limits per endpoint and lane (auto)
	Samples     int
	Stopped     bool // stopped after maxRestarts: the job never finished
	// The servers' prefix caches: prompt tokens asked for and found cached.
	Prompt, Cached float64
	TTFT           []float64 // every stored answer's time to first token, simulated seconds
	// Turns after a conversation's first, and how many of them the
	// endpoint of the turn before answered.
	LaterTurns, SameEndpoint int
	// Groups is the mean number of distinct shared prefixes (system
	// prompt and tools) each endpoint answered a turn of: how many
	// prefixes each server's cache had to hold.
	Groups float64
	// The same cache from the stored answers' usage, split by turn:
	// prompt tokens and cached tokens of first turns and of later ones.
	FirstPrompt, FirstCached, LaterPrompt, LaterCached float64
	// What bound the run (bench/internal/bound): the fleet's load over the bulk and
	// the process's CPU and speed.
	Load  bound.Load
	Usage bound.Usage
	Bound string
}

// hitRate is the share of prompt tokens the servers found cached.
func (r result) hitRate() float64 {
	if r.Prompt <= 0 {
		return 0
	}
	return r.Cached / r.Prompt
}

type endpointShare struct {
	URL    string
	KV     int
	Tokens int64
}

// bulk is the goodput of the job's first 95% of tokens: the job without
// the tail of its last long requests, which no limit can shorten.
func (r result) bulk() float64 {
	if r.Sim95 <= 0 {
		return 0
	}
	return 0.95 * float64(r.Tokens) / r.Sim95
}

func (r result) goodput() float64 {
	if r.SimSeconds <= 0 {
		return 0
	}
	return float64(r.Tokens) / r.SimSeconds
}

// maxRestarts stops a cell whose server keeps crashing.
const maxRestarts = 12

// runCell runs the whole job once at one setting on fresh servers and a
// fresh store, and measures it in simulated time.
func runCell(ctx context.Context, e env, w workload, s setting, idx int) (result, error) {
	dir := filepath.Join(e.dir, fmt.Sprintf("%s-%d", w.Name, idx))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	urls, servers, serverYAML, err := startServers(ctx, e, w)
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	if err != nil {
		return result{}, err
	}
	spec, err := writeJob(e, w, s, dir, serverYAML)
	if err != nil {
		return result{}, err
	}
	st, err := sqlite.Open(filepath.Join(dir, "sweep.db"))
	if err != nil {
		return result{}, err
	}
	defer st.Close()

	clocks := newClockWatch(urls, e.speed)
	t0, cpu0 := time.Now(), bound.CPUTime()
	stopped, runErr := runJob(ctx, e, spec, st, clocks)
	wall, cpu := time.Since(t0), bound.CPUTime()-cpu0
	if runErr != nil && !stopped {
		return result{}, fmt.Errorf("run %s at %s: %w", w.Name, s, runErr)
	}
	tot := clocks.totals()
	r := result{Setting: s, Wall: wall, SimSeconds: clocks.simSeconds(), Sim95: clocks.timeTo(0.95), Retractions: tot.retracted, Stopped: stopped,
		Prompt: tot.prompt, Cached: tot.cached}
	r.Load, r.Usage = clocks.bulkLoad(r.Sim95), bound.MeasureUsage(cpu, wall, r.SimSeconds, clocks.realSpan(), e.speed)
	r.Bound = bound.Classify(r.Load, r.Usage)
	if span := clocks.realSpan(); span > 0 {
		r.EffSpeed = r.SimSeconds / span.Seconds()
	}
	if err := collect(ctx, e, w, st, urls, t0, &r); err != nil {
		return result{}, err
	}
	return r, nil
}

// startServers starts a multi-server workload's servers here and lists
// them as endpoints, or describes the single server regen launches; it
// returns the servers' URLs and the job file's server section.
func startServers(ctx context.Context, e env, w workload) (urls []string, servers []*sim.Server, serverYAML string, err error) {
	if len(w.Servers) == 1 {
		port, err := freePort()
		if err != nil {
			return nil, nil, "", err
		}
		urls = []string{fmt.Sprintf("http://127.0.0.1:%d", port)}
		serverYAML = fmt.Sprintf("server:\n  engine: sim\n  port: %d\n  ready_timeout: 2m\n  hang_timeout: 60s\n  restart: {max: 10, window: %s, backoff: %s}\n", port, simDuration(30*time.Minute, e.speed), simDuration(30*time.Second, e.speed))
		if w.Supervised {
			serverYAML += fmt.Sprintf("  command: [%q, sim]\n", e.regenBin)
		}
		serverYAML += "  sim:\n" + yamlMap(simKnobs(e, w, w.Servers[0]), "    ")
		return urls, nil, serverYAML, nil
	}
	// Several servers: started here, listed as endpoints (regen probes
	// them; nothing restarts them, so these workloads have no faults).
	serverYAML = "endpoints:\n"
	for _, sv := range w.Servers {
		cfg := sim.DefaultConfig()
		cfg.ModelName = "sim"
		if err := cfg.Apply(simKnobs(e, w, sv)); err != nil {
			return nil, servers, "", err
		}
		srv, err := sim.New(cfg, io.Discard)
		if err != nil {
			return nil, servers, "", err
		}
		servers = append(servers, srv)
		url, err := srv.Start(ctx, "127.0.0.1:0")
		if err != nil {
			return nil, servers, "", err
		}
		<-srv.Ready()
		urls = append(urls, url)
		serverYAML += fmt.Sprintf("  - {url: %q, engine: sim}\n", url)
	}
	return urls, servers, serverYAML, nil
}

// writeJob writes the cell's job file in dir and loads it.
func writeJob(e env, w workload, s setting, dir, serverYAML string) (*job.Spec, error) {
	source, maxPrompt := fmt.Sprintf("{partition: p, path: %q, prompt: prompt, id: id}", e.prompts), shortMaxPrompt
	if w.MultiTurn {
		// Every turn in the short lane: a conversation's turns share its prefix.
		path := e.conversations
		if w.Long {
			path = e.long
		}
		source, maxPrompt = fmt.Sprintf("{partition: p, path: %q, conversations: conversations, system_field: system, id: id}", path), 1000000
	}
	if s.Balance != "" {
		serverYAML = "balance: " + s.Balance + "\n" + serverYAML
	}
	jobYAML := fmt.Sprintf(`name: sweep
model: sim
sources:
  - %s
lanes:
  - {name: short, concurrency: %s, max_tokens: %d, max_prompt_tokens: %d}
  - {name: long, concurrency: %s, max_tokens: %d}
store: {dsn: %q}
monitor: {heartbeat_every: 1s, dead_after: 1m, stall_after: 5m, hang_after: 60s, probe_every: %s}
%s`, source, laneConcurrency(s.Short), shortMaxTokens, maxPrompt, laneConcurrency(s.Long), longMaxTokens,
		filepath.Join(dir, "sweep.db"), e.probe, serverYAML)
	jobPath := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobPath, []byte(jobYAML), 0o644); err != nil {
		return nil, err
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		return nil, fmt.Errorf("job file:\n%s\n%w", jobYAML, err)
	}
	return spec, nil
}

// runJob runs the job through regen's runner while clocks follows the
// servers; stopped reports a cell stopped after maxRestarts.
func runJob(ctx context.Context, e env, spec *job.Spec, st *sqlite.Store, clocks *clockWatch) (stopped bool, err error) {
	pollCtx, stopPoll := context.WithCancel(ctx)
	pollDone := make(chan struct{})
	go func() { defer close(pollDone); clocks.run(pollCtx) }()
	defer func() { stopPoll(); <-pollDone }()

	logger := slog.New(slog.DiscardHandler)
	if e.verbose {
		logger = slog.New(slog.NewTextHandler(e.logWriter, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
	}
	// A server that crashes again at every restart never finishes the job:
	// the cell stops after maxRestarts and says so.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go func() {
		for runCtx.Err() == nil {
			if clocks.restarts() >= maxRestarts {
				stopRun()
				return
			}
			select {
			case <-runCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	_, err = runner.Run(runCtx, runner.Options{Spec: spec, Store: st, Logger: logger, NoExport: true, ProgressEvery: time.Hour, DrainTimeout: time.Second})
	return err != nil && ctx.Err() == nil && runCtx.Err() != nil, err
}

// collect reads the stored answers and events into r: tokens per
// endpoint, TTFT, crashes and the final limits.
func collect(ctx context.Context, e env, w workload, st *sqlite.Store, urls []string, t0 time.Time, r *result) error {
	per := map[string]int64{}
	groups := map[string]map[uint64]bool{}
	var rows []store.Row
	err := st.Finished(ctx, func(row store.Row) error {
		r.Samples++
		if key, _ := conversation.SharedPrefix(row.Body); key != 0 {
			for _, res := range append(row.Prior, row.Result) {
				if groups[res.Endpoint] == nil {
					groups[res.Endpoint] = map[uint64]bool{}
				}
				groups[res.Endpoint][key] = true
			}
		}
		for i := 1; i <= len(row.Prior); i++ {
			prev, this := row.Prior[i-1].Endpoint, row.Result.Endpoint
			if i < len(row.Prior) {
				this = row.Prior[i].Endpoint
			}
			r.LaterTurns++
			if this == prev {
				r.SameEndpoint++
			}
		}
		for _, res := range append(row.Prior, row.Result) {
			if rec, err := reply.Decode(res); err == nil && rec.Usage.PromptTokens > 0 {
				if res.Turn == 0 {
					r.FirstPrompt += float64(rec.Usage.PromptTokens)
					r.FirstCached += float64(rec.Usage.CachedTokens)
				} else {
					r.LaterPrompt += float64(rec.Usage.PromptTokens)
					r.LaterCached += float64(rec.Usage.CachedTokens)
				}
			}
			r.Tokens += int64(res.CompletionTokens)
			per[res.Endpoint] += int64(res.CompletionTokens)
			if res.TTFT > 0 {
				r.TTFT = append(r.TTFT, res.TTFT.Seconds()*e.speed)
			}
		}
		if e.verbose {
			row.Body, row.Result.Response, row.Prior = nil, nil, nil
			rows = append(rows, row)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if e.verbose {
		logTail(e.logWriter, rows, urls, t0, e.speed)
	}
	for _, g := range groups {
		r.Groups += float64(len(g)) / float64(len(groups))
	}
	for i, u := range urls {
		r.PerEndpoint = append(r.PerEndpoint, endpointShare{URL: u, KV: w.Servers[i].KVTokens, Tokens: per[u]})
	}
	events, err := st.Events(ctx, 0)
	if err != nil {
		return err
	}
	for _, ev := range events {
		if ev.Kind == "endpoint_state" && ev.State == "DOWN" {
			r.Crashes++
		}
		if ev.Kind == "endpoint_limit" && len(r.Limits) < 6 {
			r.Limits = append(r.Limits, ev.Subject+": "+ev.Evidence)
		}
	}
	return nil
}

func laneConcurrency(n int) string {
	if n == 0 {
		return "auto"
	}
	return fmt.Sprint(n)
}

// simKnobs are the simulator flags of one server of w.
func simKnobs(e env, w workload, sv server) map[string]any {
	m := map[string]any{
		"kv_tokens":    sv.KVTokens,
		"speed":        e.speed,
		"output_mean":  w.OutputMean,
		"output_sigma": w.OutputSigma,
		"seed":         1,
		"load_time":    "60s", // a relaunch reloads weights: a minute of simulated time
		"warmup_time":  "5s",
		// Tokens reach each stream 16 at a time (SGLang's --stream-interval):
		// a sixteenth of the wake-ups and writes, and so of the CPU that
		// otherwise makes a shared machine the bottleneck.
		"stream_interval": e.streamInterval,
	}
	if w.MultiTurn && e.priority {
		// The servers order their queues by the requests' priority, as
		// SGLang does with --enable-priority-scheduling.
		m["enable_priority_scheduling"] = true
	}
	if e.profile != "" {
		m["profile"] = e.profile
	}
	m["truncate_fraction"] = w.Truncate
	if truncateOverride >= 0 {
		m["truncate_fraction"] = truncateOverride
	}
	for k, v := range sv.Sim {
		m[k] = v
	}
	for k, v := range simOverride {
		m[k] = v
	}
	return m
}

// simDuration is the real duration of d simulated, for job options that
// are real time (the restart policy): a restart waits 30 simulated seconds
// (doubling while failures repeat) and failures are counted over 30
// simulated minutes, as the defaults do on a real server.
func simDuration(d time.Duration, speed float64) string {
	return (time.Duration(float64(d) / speed)).Round(time.Millisecond).String()
}

func yamlMap(m map[string]any, indent string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v := m[k]
		if s, ok := v.(string); ok {
			fmt.Fprintf(&b, "%s%s: %q\n", indent, k, s)
		} else {
			fmt.Fprintf(&b, "%s%s: %v\n", indent, k, v)
		}
	}
	return b.String()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logTail lists the job's last answers to finish, in simulated seconds
// since the start (wall time times the speed): what the job's tail was.
func logTail(w io.Writer, rows []store.Row, urls []string, t0 time.Time, speed float64) {
	sort.Slice(rows, func(i, j int) bool { return rows[i].FinishedAt.Before(rows[j].FinishedAt) })
	simAt := func(t time.Time) float64 { return t.Sub(t0).Seconds() * speed }
	ep := map[string]int{}
	for i, u := range urls {
		ep[u] = i
	}
	fmt.Fprintln(w, "tail: the last answers (simulated s: start, end; lane, endpoint, tokens, attempts)")
	for _, row := range rows[max(len(rows)-15, 0):] {
		end := simAt(row.FinishedAt)
		fmt.Fprintf(w, "  %s %6.0f %6.0f  %-5s ep%d %6d  %d\n", row.ID, end-row.Result.Duration.Seconds()*speed, end,
			row.Lane, ep[row.Result.Endpoint], row.Result.CompletionTokens, row.Attempts)
	}
}
