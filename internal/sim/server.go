package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClockMetric is the gauge on /metrics holding the simulated seconds since
// the server started: what a measurement divides by to get rates in
// simulated time, whatever the Speed and however busy the CPU was.
const ClockMetric = "regen_sim_clock_seconds"

const (
	stateUp int32 = iota
	stateStarting
	stateDead
)

// Server is one simulated inference server.
type Server struct {
	cfg   Config
	log   *logger
	m     *metrics
	sched *scheduler
	mux   *http.ServeMux

	faults    []*faultState
	reqFaults []*faultState
	cuts      []*faultState // cut faults, by prompt (reqfault.go)
	throttles []*faultState // throttle faults, by time (reqfault.go)
	brokens   []*faultState // broken faults, by time or request count (reqfault.go)
	readyAt   atomic.Int64  // wall clock (unix ns) the server became ready; 0 before
	reqCount  atomic.Int64
	nextID    atomic.Uint64
	captures  atomic.Int64   // capture requests so far (capture.go)
	writers   sync.WaitGroup // slow hidden-state writers
	created   int64

	state    atomic.Int32
	readySim atomic.Int64 // simulated time the server became ready; -1 before
	ready    chan struct{}
	readyOne sync.Once

	crashed   chan int
	dead      chan struct{}
	crashOnce sync.Once

	ctx       context.Context // scheduler and warm-up lifetime
	cancel    context.CancelFunc
	schedDone chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	handlers  sync.WaitGroup

	mu      sync.Mutex
	httpSrv *http.Server
	serving chan struct{} // closed when Serve returns
}

// New builds a server and starts its scheduler. Without Start the server
// is ready at once and Handler serves it (for httptest); Start adds the
// load time, binding and warm-up. Log lines in the engine's format go to
// logOut (nil discards them).
func New(cfg Config, logOut io.Writer) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sim config: %w", err)
	}
	cfg.slotted()
	fl, err := cfg.faults()
	if err != nil {
		return nil, fmt.Errorf("sim faults: %w", err)
	}
	s := &Server{
		cfg:       cfg,
		log:       newLogger(logOut),
		created:   time.Now().Unix(),
		ready:     make(chan struct{}),
		crashed:   make(chan int, 1),
		dead:      make(chan struct{}),
		schedDone: make(chan struct{}),
		closing:   make(chan struct{}),
	}
	for _, f := range fl {
		fs := &faultState{Fault: f}
		fs.remaining.Store(int64(f.Count))
		switch f.Kind {
		case FaultCut:
			s.cuts = append(s.cuts, fs)
			continue
		case FaultBroken:
			s.brokens = append(s.brokens, fs)
			continue
		case FaultThrottle:
			s.throttles = append(s.throttles, fs)
			continue
		}
		if f.perRequest() {
			if f.At == 0 && f.AfterTokens == 0 && f.KVAbove == 0 && f.AfterRequests == 0 {
				fs.fired.Store(true)
			}
			s.reqFaults = append(s.reqFaults, fs)
		}
		s.faults = append(s.faults, fs)
	}
	s.m = newMetrics(&s.cfg)
	s.sched = newScheduler(s)
	if err := s.sched.startMissDiag(); err != nil {
		return nil, fmt.Errorf("sim config: %w", err)
	}
	s.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ClockMetric,
		Help: "Simulated seconds since this server started (regen's simulator only; no engine has it)."},
		func() float64 { return s.sched.clockNow().Seconds() }))
	s.readySim.Store(0)
	s.markReady()
	s.mux = s.routes()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(s.schedDone)
		s.sched.run(s.ctx)
	}()
	return s, nil
}

// Handler serves the HTTP API in the server's current state.
func (s *Server) Handler() http.Handler {
	if s.cfg.Engine == EngineLlamaCpp {
		return llamaServerHeader(s.mux)
	}
	return s.mux
}

// Ready is closed once the server answers generation health checks.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Crashed receives the exit code once when a fault crashes the server; by
// then its listener and every connection are closed.
func (s *Server) Crashed() <-chan int { return s.crashed }

func (s *Server) markReady() {
	s.readyAt.Store(time.Now().UnixNano())
	s.readyOne.Do(func() { close(s.ready) })
}

// Start imitates an engine launch: it logs the loading lines, waits the
// simulated load time (the port refuses connections meanwhile, as SGLang
// binds only after loading), binds addr and returns its URL. A warm-up
// follows in the background (/health answers 503) and ends with the ready
// line. The server runs until Close or until ctx ends.
func (s *Server) Start(ctx context.Context, addr string) (string, error) {
	select {
	case <-s.closing:
		return "", errors.New("start sim: server closed")
	default:
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("start sim: %w", err)
	}
	s.state.Store(stateStarting)
	s.readySim.Store(-1)
	s.readyAt.Store(0)
	s.ready = make(chan struct{})
	s.readyOne = sync.Once{}
	s.logLoading()
	load := s.sched.realDelay(s.cfg.LoadTime)
	t := time.NewTimer(load)
	select {
	case <-ctx.Done():
		t.Stop()
		return "", fmt.Errorf("start sim: %w", ctx.Err())
	case <-s.closing:
		t.Stop()
		return "", errors.New("start sim: server closed")
	case <-t.C:
	}
	s.logLoaded()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("start sim: %w", err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: time.Minute}
	s.mu.Lock()
	s.httpSrv = srv
	s.serving = make(chan struct{})
	serving := s.serving
	s.mu.Unlock()
	go func() {
		defer close(serving)
		srv.Serve(ln)
	}()
	url := "http://" + ln.Addr().String()
	if s.cfg.Engine == EngineVLLM {
		s.log.vllm("INFO", "api_server.py:1880", "Starting vLLM API server 0 on %s", url)
		s.log.raw("INFO:     Application startup complete.\n")
		s.becomeReady()
	} else if s.cfg.Engine == EngineLlamaCpp {
		s.log.raw(fmt.Sprintf("main: server is listening on %s\n", url))
		s.becomeReady()
	} else {
		s.log.raw("INFO:     Uvicorn running on " + url + " (Press CTRL+C to quit)\n")
		go s.warmup()
	}
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.closing:
		}
	}()
	return url, nil
}

func (s *Server) warmup() {
	t := time.NewTimer(s.sched.realDelay(s.cfg.WarmupTime))
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return
	case <-t.C:
	}
	// SGLang's warm-up is a real 8-token generation.
	p := s.probe(8)
	for !p.done.Load() {
		select {
		case <-s.ctx.Done():
			return
		case <-p.notify:
		}
	}
	s.log.sglang(false, "The server is fired up and ready to roll!")
	s.becomeReady()
}

func (s *Server) becomeReady() {
	s.readySim.Store(s.sched.simClock.Load())
	s.state.CompareAndSwap(stateStarting, stateUp)
	s.markReady()
	s.sched.poke()
}

// probe submits an internal request of n tokens (health and warm-up).
func (s *Server) probe(n int) *request {
	r := &request{id: fmt.Sprintf("HEALTH_CHECK_%d", time.Now().UnixNano()), kind: kindProbe, prompt: 1, maxNew: n,
		plan: outputPlan{target: n, finish: "length", toolStart: -1}, arrived: time.Now(), notify: make(chan struct{}, 1)}
	go func() {
		select {
		case s.sched.inbox <- r:
		case <-s.ctx.Done():
		}
	}()
	return r
}

// Close stops the server at once: listener, connections, scheduler.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.mu.Lock()
		srv, serving := s.httpSrv, s.serving
		s.mu.Unlock()
		if srv != nil {
			srv.Close()
			<-serving
		}
		s.cancel()
		<-s.schedDone
		s.handlers.Wait()
		s.writers.Wait()
		if s.sched.diag != nil {
			s.sched.diag.close()
		}
	})
	return nil
}

// crash is a fatal scheduler error: crash text, then every connection is cut.
func (s *Server) crash(code int, kind string) {
	s.crashOnce.Do(func() {
		if kind != "abrupt" {
			if s.cfg.Engine == "vllm" {
				s.log.vllm("ERROR", "core.py:710", "EngineCore encountered a fatal error.")
				s.log.raw(crashText("vllm", kind))
				s.log.vllm("ERROR", "async_llm.py:480", "AsyncLLM output_handler failed.")
				s.log.raw("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.\n")
			} else {
				s.log.sglang(true, "Scheduler hit an exception: %s", strings.TrimSuffix(crashText("sglang", kind), "\n"))
				s.log.sglang(false, "Received sigquit from a child process. It usually means the child failed.")
			}
		}
		s.die(code)
	})
}

func (s *Server) watchdogCrash(code int) {
	s.crashOnce.Do(func() {
		s.log.sglang(true, "Watchdog timeout (self.watchdog_timeout=%g)", s.cfg.WatchdogTimeout.Seconds())
		s.log.sglang(false, "Received sigquit from a child process. It usually means the child failed.")
		s.die(code)
	})
}

func (s *Server) die(code int) {
	s.state.Store(stateDead)
	close(s.dead)
	s.mu.Lock()
	srv := s.httpSrv
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	s.cancel()
	s.crashed <- code
}

func (s *Server) logLoading() {
	if s.cfg.Engine == "vllm" {
		s.log.vllm("INFO", "api_server.py:1805", "vLLM API server version 0.11.0 (simulated)")
		s.log.vllm("INFO", "gpu_model_runner.py:2050", "Starting to load model %s...", s.cfg.ModelPath)
		return
	}
	s.log.sglang(false, "server_args=ServerArgs(model_path='%s', served_model_name='%s', tp_size=%d, mem_fraction_static=%g, max_running_requests=%d, context_length=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, watchdog_timeout=%g, enable_metrics=True)",
		s.cfg.ModelPath, s.cfg.modelName(), s.cfg.TP, s.cfg.MemFractionStatic, s.cfg.MaxRunningRequests, s.cfg.ContextLen,
		s.cfg.ChunkedPrefillSize, s.cfg.MaxPrefillTokens, s.cfg.WatchdogTimeout.Seconds())
	s.log.sglang(true, "Load weight begin. avail mem=94.37 GB")
}

func (s *Server) logLoaded() {
	kv := s.cfg.kvTokens()
	gb := float64(kv) * 70272 / (1 << 30) // bytes per token of Kimi-K2.5's MLA cache in bf16
	if s.cfg.Engine == "vllm" {
		s.log.vllm("INFO", "gpu_worker.py:298", "Available KV cache memory: %.2f GiB", gb)
		s.log.vllm("INFO", "kv_cache_utils.py:1087", "GPU KV cache size: %d tokens", kv)
		s.log.vllm("INFO", "kv_cache_utils.py:1091", "Maximum concurrency for %d tokens per request: %.2fx", s.cfg.ContextLen, float64(kv)/float64(s.cfg.ContextLen))
		return
	}
	s.log.sglang(true, "Load weight end. elapsed=%.2f s, type=KimiK25ForConditionalGeneration, avail mem=%.2f GB, mem usage=%.2f GB.", s.cfg.LoadTime.Seconds(), 94.37-72.0, 72.0)
	s.log.sglang(true, "KV Cache is allocated. #tokens: %d, KV size: %.2f GB", kv, gb)
	s.log.sglang(true, "Memory pool end. avail mem=%.2f GB", 6.1)
	s.log.sglang(true, "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, context_len=%d, available_gpu_mem=%.2f GB",
		kv, s.cfg.ChunkedPrefillSize, s.cfg.MaxPrefillTokens, s.cfg.maxRunning(), s.cfg.ContextLen, 6.1)
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	h := func(pattern string, f http.HandlerFunc) { mux.Handle(pattern, s.track(f)) }
	h("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, kindChat) })
	h("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, kindCompletion) })
	h("GET /v1/models", s.handleModels)
	h("GET /v1/models/{model...}", s.handleModel)
	h("GET /metrics", s.m.handler().ServeHTTP)
	h("GET /ping", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	current := s.cfg.APIShape != ShapePrevious
	switch s.cfg.Engine {
	case EngineLlamaCpp:
		s.llamaRoutes(h)
		return mux
	case EngineVLLM:
		h("GET /health", s.handleVLLMHealth)
		h("POST /tokenize", s.handleVLLMTokenize)
		h("GET /version", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, map[string]string{"version": "0.11.0"})
		})
		if current {
			h("GET /load", s.handleVLLMLoad)
			// Releases before the render routes answer 404 (regen probes it).
			h("POST /v1/chat/completions/render", s.handleVLLMRender)
		}
		return mux
	}
	h("GET /health", s.handleHealth)
	h("GET /health_generate", s.handleHealth)
	h("GET /get_server_info", s.handleServerInfo)
	if current {
		h("GET /server_info", s.handleServerInfo)
		h("GET /v1/loads", s.handleLoads)
	}
	h("GET /get_model_info", s.handleModelInfo)
	h("GET /model_info", s.handleModelInfo)
	return mux
}

// track counts handlers so Close can wait for them.
func (s *Server) track(f http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.closing:
			writeError(w, http.StatusServiceUnavailable, "server is shutting down")
			return
		default:
		}
		s.handlers.Add(1)
		defer s.handlers.Done()
		f(w, r)
	})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]any{"object": "list", "data": []any{s.modelCard()}})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("model") != s.cfg.modelName() {
		writeJSON(w, 404, map[string]any{"error": map[string]any{"message": fmt.Sprintf("The model '%s' does not exist", r.PathValue("model")),
			"type": "invalid_request_error", "param": "model", "code": "model_not_found"}})
		return
	}
	writeJSON(w, 200, s.modelCard())
}

func (s *Server) modelCard() map[string]any {
	card := map[string]any{"id": s.cfg.modelName(), "object": "model", "created": s.created, "owned_by": s.cfg.Engine}
	switch {
	case s.cfg.Engine == EngineLlamaCpp:
		card["meta"] = s.cfg.llamaModelMeta()
	case s.cfg.APIShape == ShapePrevious && s.cfg.Engine == EngineVLLM:
		card["root"], card["parent"] = s.cfg.modelName(), nil
	default:
		card["root"], card["parent"], card["max_model_len"] = s.cfg.modelName(), nil, s.cfg.ContextLen
	}
	return card
}

func (s *Server) handleModelInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]any{"model_path": s.cfg.ModelPath, "tokenizer_path": s.cfg.ModelPath,
		"is_generation": true, "preferred_sampling_params": nil, "weight_version": "default"})
}

// handleHealth is SGLang's health_generate: 503 while starting, else a
// 1-token probe that passes when any output appears within HealthTimeout.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.state.Load() != stateUp {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	tic := time.Now()
	p := s.probe(1)
	defer p.cancel.Store(true)
	timeout := time.NewTimer(s.sched.realDelay(s.cfg.HealthTimeout))
	defer timeout.Stop()
	poll := time.NewTicker(min(max(s.sched.realDelay(time.Second), time.Millisecond), 100*time.Millisecond))
	defer poll.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.dead:
			panic(http.ErrAbortHandler)
		case <-p.notify:
			if p.avail.Load() > 0 {
				w.WriteHeader(http.StatusOK)
				return
			}
		case <-poll.C:
			if s.sched.lastProgress.Load() > tic.UnixNano() && !s.sched.stuck.Load() {
				w.WriteHeader(http.StatusOK)
				return
			}
		case <-timeout.C:
			last := time.Unix(0, s.sched.lastProgress.Load())
			s.log.sglang(false, "Health check failed. Server couldn't get a response from detokenizer for last %g seconds. tic start time: %s. last_heartbeat time: %s",
				s.cfg.HealthTimeout.Seconds(), tic.Format("15:04:05"), last.Format("15:04:05"))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
}

// handleVLLMHealth is vLLM's: no generation; 503 only when the engine is dead.
func (s *Server) handleVLLMHealth(w http.ResponseWriter, r *http.Request) {
	if s.state.Load() != stateUp || s.sched.deadPub.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handleServerInfo needs a scheduler round trip, so it cannot answer while
// the scheduler is stuck: it waits HealthTimeout and answers 503.
func (s *Server) handleServerInfo(w http.ResponseWriter, r *http.Request) {
	if s.sched.stuck.Load() {
		t := time.NewTimer(s.sched.realDelay(s.cfg.HealthTimeout))
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-s.dead:
			panic(http.ErrAbortHandler)
		case <-t.C:
		}
		writeError(w, http.StatusServiceUnavailable, "scheduler is not responding")
		return
	}
	st := s.sched.snap.Load()
	c := &s.cfg
	// The top level is rank 0's scheduler info, as SGLang merges it.
	kv := s.dpRanks(st)[0]["max_total_num_tokens"]
	writeJSON(w, 200, map[string]any{
		"dp_size":                   c.DP,
		"model_path":                c.ModelPath,
		"served_model_name":         c.modelName(),
		"tp_size":                   c.TP,
		"mem_fraction_static":       c.MemFractionStatic,
		"max_running_requests":      c.maxRunning(),
		"max_total_tokens":          nilIfZero(c.MaxTotalTokens),
		"context_length":            c.ContextLen,
		"chunked_prefill_size":      c.ChunkedPrefillSize,
		"max_prefill_tokens":        c.MaxPrefillTokens,
		"schedule_conservativeness": c.ScheduleConservativeness,
		"decode_log_interval":       c.DecodeLogInterval,
		"watchdog_timeout":          c.WatchdogTimeout.Seconds(),
		"enable_metrics":            true,
		// SGLang's server arguments for priority scheduling (server_args.py).
		"enable_priority_scheduling":         c.PriorityScheduling,
		"schedule_low_priority_values_first": c.LowPriorityFirst,
		"max_total_num_tokens":               kv,
		"max_req_input_len":                  min(c.ContextLen, c.kvTokens()) - 1,
		"internal_states":                    s.internalStates(st),
		"version":                            simSGLangVersion,
	})
}

func nilIfZero(n int) any {
	if n == 0 {
		return nil
	}
	return n
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b)
}

// writeError writes SGLang's (and vLLM's) OpenAI-style error object.
func writeError(w http.ResponseWriter, code int, msg string) {
	typ := strings.ReplaceAll(http.StatusText(code), " ", "") + "Error"
	writeJSON(w, code, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": code})
}
