// Command fakeserver is a stand-in for an SGLang server in the supervisor's
// tests: it speaks just enough of SGLang's HTTP surface and log format, can
// fork a "scheduler" child into its process group, and misbehaves on demand.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func logf(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("2006-01-02 15:04:05"), fmt.Sprintf(format, args...))
}

// options are the command line: SGLang's own flags and the faults to act out.
type options struct {
	model, host                            string
	port                                   int
	startDelay, crashAfter                 time.Duration
	forkChild, child, ignoreTerm           bool
	childExitAfter, hangAfter, freezeAfter time.Duration
	tokenEvery, fatalAfter, retractEvery   time.Duration
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.model, "model-path", "fake-model", "model name")
	flag.StringVar(&o.host, "host", "127.0.0.1", "bind host")
	flag.IntVar(&o.port, "port", 30000, "bind port")
	flag.Bool("enable-metrics", false, "accepted for SGLang compatibility")
	flag.DurationVar(&o.startDelay, "start-delay", 0, "sleep before binding the port (weight loading)")
	flag.DurationVar(&o.crashAfter, "crash-after", -1, "print a CUDA OOM traceback and exit 1 after this long (0 = before binding)")
	flag.BoolVar(&o.forkChild, "fork-child", false, "start a scheduler child process in the same group")
	flag.DurationVar(&o.childExitAfter, "child-exit-after", 0, "the child exits by itself after this long (0 = never)")
	flag.DurationVar(&o.hangAfter, "hang-after", 0, "after this long /health answers 503 (0 = never)")
	flag.DurationVar(&o.freezeAfter, "freeze-after", 0, "after this long no token is generated, health stays 200 (0 = never)")
	flag.DurationVar(&o.tokenEvery, "token-every", 20*time.Millisecond, "time per generated token")
	flag.DurationVar(&o.fatalAfter, "log-fatal-after", 0, "log SGLang's health-check failure after this long but keep running (0 = never)")
	flag.DurationVar(&o.retractEvery, "retract-every", 0, "log a KV retraction warning this often (0 = never)")
	flag.BoolVar(&o.child, "child", false, "run as the scheduler child")
	flag.BoolVar(&o.ignoreTerm, "ignore-term", false, "ignore SIGTERM, as an engine busy shutting its workers down (only SIGKILL ends it)")
	flag.Parse()
	return o
}

func main() {
	o := parseFlags()
	if o.ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}
	if o.child {
		runChild(o.childExitAfter)
		return
	}
	srv := &server{o: o, start: time.Now()}
	logf("server_args=ServerArgs(model_path='%s', host='%s', port=%d)", o.model, o.host, o.port)
	if o.forkChild {
		forkChild(o.childExitAfter)
	}
	scheduleFaults(o)
	time.Sleep(o.startDelay)
	logf("[TP0] max_total_num_tokens=100000, chunked_prefill_size=8192, max_running_requests=64, context_len=32768")
	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		logf("listen: %v", err)
		os.Exit(2)
	}
	var once sync.Once
	go func() {
		// Warm-up done: SGLang prints this after its first /generate.
		time.Sleep(50 * time.Millisecond)
		once.Do(func() { logf("The server is fired up and ready to roll!") })
	}()
	go srv.logDecode()
	http.Serve(ln, srv.mux())
}

// forkChild starts a scheduler child in this process group.
func forkChild(exitAfter time.Duration) {
	args := []string{"--child"}
	if exitAfter > 0 {
		args = append(args, "--child-exit-after", exitAfter.String())
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		logf("fork child: %v", err)
		os.Exit(2)
	}
	logf("scheduler child pid=%d", cmd.Process.Pid)
	// Never reaped on purpose: a dead child stays a zombie, as with a
	// parent that did not notice.
}

// scheduleFaults arms the crash, the fatal log line and the retraction
// warnings the flags ask for.
func scheduleFaults(o options) {
	if o.crashAfter == 0 {
		crash()
	}
	if o.crashAfter > 0 {
		time.AfterFunc(o.crashAfter, crash)
	}
	if o.fatalAfter > 0 {
		time.AfterFunc(o.fatalAfter, func() {
			logf("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. tic start time: 10:00:00. last_heartbeat time: 09:59:40")
		})
	}
	if o.retractEvery > 0 {
		go func() {
			for range time.Tick(o.retractEvery) {
				logf("[TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 646, #new_token_ratio: 0.0980 -> 0.3487")
			}
		}()
	}
}

// server is the fake's HTTP surface and its counters.
type server struct {
	o                              options
	start                          time.Time
	genTotal, promptTotal, running atomic.Int64
}

func (s *server) hung() bool   { return s.o.hangAfter > 0 && time.Since(s.start) > s.o.hangAfter }
func (s *server) frozen() bool { return s.o.freezeAfter > 0 && time.Since(s.start) > s.o.freezeAfter }

func (s *server) mux() *http.ServeMux {
	mux := http.NewServeMux()
	health := func(w http.ResponseWriter, r *http.Request) {
		if s.hung() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /health_generate", health)
	mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"max_total_num_tokens": 100000, "model_path": s.o.model})
	})
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	return mux
}

func (s *server) metrics(w http.ResponseWriter, r *http.Request) {
	model := s.o.model
	labels := fmt.Sprintf(`engine_type="unified",model_name=%q,pp_rank="0",tp_rank="0"`, model)
	run, queue := s.running.Load(), int64(0)
	if s.frozen() {
		run, queue = max(run, 1), 1
	}
	fmt.Fprintf(w, "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{%s} %d\n", labels, run)
	fmt.Fprintf(w, "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{%s} %d\n", labels, queue)
	fmt.Fprintf(w, "# TYPE sglang:token_usage gauge\nsglang:token_usage{%s} %.2f\n", labels, float64(run)*0.01)
	fmt.Fprintf(w, "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{%s} 100000\n", labels)
	fmt.Fprintf(w, "# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total{model_name=%q} %d\n", model, s.genTotal.Load())
	fmt.Fprintf(w, "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=%q} %d\n", model, s.promptTotal.Load())
}

func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxTokens int `json:"max_tokens"`
	}
	json.NewDecoder(r.Body).Decode(&req)
	if req.MaxTokens <= 0 {
		req.MaxTokens = 16
	}
	s.running.Add(1)
	defer s.running.Add(-1)
	s.promptTotal.Add(10)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for i := 0; i < req.MaxTokens; i++ {
		for s.frozen() {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(s.o.tokenEvery):
		}
		s.genTotal.Add(1)
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		if err := rc.Flush(); err != nil {
			return
		}
	}
	fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	rc.Flush()
}

// logDecode prints SGLang's decode line every second while requests run.
func (s *server) logDecode() {
	for range time.Tick(time.Second) {
		if n := s.running.Load(); n > 0 {
			logf("[TP0] Decode batch, #running-req: %d, #token: %d, token usage: 0.01, cuda graph: False, gen throughput (token/s): %.2f, #queue-req: 0, ", n, n*100, float64(n)/s.o.tokenEvery.Seconds())
		}
	}
}

func crash() {
	logf("[TP0] Scheduler hit an exception: Traceback (most recent call last):")
	fmt.Println(`  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2571, in run_scheduler_process`)
	fmt.Println("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 95.00 GiB of which 1.10 GiB is free.")
	logf("Received sigquit from a child process. It usually means the child failed.")
	os.Exit(1)
}

func runChild(exitAfter time.Duration) {
	logf("[TP0] scheduler child started pid=%d pgid=%d", os.Getpid(), syscall.Getpgrp())
	if exitAfter > 0 {
		time.Sleep(exitAfter)
		logf("[TP0] scheduler child exiting")
		os.Exit(3)
	}
	select {}
}
