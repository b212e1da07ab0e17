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

func main() {
	model := flag.String("model-path", "fake-model", "model name")
	host := flag.String("host", "127.0.0.1", "bind host")
	port := flag.Int("port", 30000, "bind port")
	flag.Bool("enable-metrics", false, "accepted for SGLang compatibility")
	startDelay := flag.Duration("start-delay", 0, "sleep before binding the port (weight loading)")
	crashAfter := flag.Duration("crash-after", -1, "print a CUDA OOM traceback and exit 1 after this long (0 = before binding)")
	forkChild := flag.Bool("fork-child", false, "start a scheduler child process in the same group")
	childExitAfter := flag.Duration("child-exit-after", 0, "the child exits by itself after this long (0 = never)")
	hangAfter := flag.Duration("hang-after", 0, "after this long /health answers 503 (0 = never)")
	freezeAfter := flag.Duration("freeze-after", 0, "after this long no token is generated, health stays 200 (0 = never)")
	tokenEvery := flag.Duration("token-every", 20*time.Millisecond, "time per generated token")
	fatalAfter := flag.Duration("log-fatal-after", 0, "log SGLang's health-check failure after this long but keep running (0 = never)")
	retractEvery := flag.Duration("retract-every", 0, "log a KV retraction warning this often (0 = never)")
	child := flag.Bool("child", false, "run as the scheduler child")
	ignoreTerm := flag.Bool("ignore-term", false, "ignore SIGTERM, as an engine busy shutting its workers down (only SIGKILL ends it)")
	flag.Parse()
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}

	if *child {
		runChild(*childExitAfter)
		return
	}
	start := time.Now()
	logf("server_args=ServerArgs(model_path='%s', host='%s', port=%d)", *model, *host, *port)
	if *forkChild {
		args := []string{"--child"}
		if *childExitAfter > 0 {
			args = append(args, "--child-exit-after", childExitAfter.String())
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
	if *crashAfter == 0 {
		crash()
	}
	if *crashAfter > 0 {
		time.AfterFunc(*crashAfter, crash)
	}
	if *fatalAfter > 0 {
		time.AfterFunc(*fatalAfter, func() {
			logf("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. tic start time: 10:00:00. last_heartbeat time: 09:59:40")
		})
	}
	if *retractEvery > 0 {
		go func() {
			for range time.Tick(*retractEvery) {
				logf("[TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 646, #new_token_ratio: 0.0980 -> 0.3487")
			}
		}()
	}
	time.Sleep(*startDelay)
	logf("[TP0] max_total_num_tokens=100000, chunked_prefill_size=8192, max_running_requests=64, context_len=32768")

	var genTotal, promptTotal atomic.Int64
	var running atomic.Int64
	hung := func() bool { return *hangAfter > 0 && time.Since(start) > *hangAfter }
	frozen := func() bool { return *freezeAfter > 0 && time.Since(start) > *freezeAfter }

	mux := http.NewServeMux()
	health := func(w http.ResponseWriter, r *http.Request) {
		if hung() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /health_generate", health)
	mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"max_total_num_tokens": 100000, "model_path": *model})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		labels := fmt.Sprintf(`engine_type="unified",model_name=%q,pp_rank="0",tp_rank="0"`, *model)
		run, queue := running.Load(), int64(0)
		if frozen() {
			run, queue = max(run, 1), 1
		}
		fmt.Fprintf(w, "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{%s} %d\n", labels, run)
		fmt.Fprintf(w, "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{%s} %d\n", labels, queue)
		fmt.Fprintf(w, "# TYPE sglang:token_usage gauge\nsglang:token_usage{%s} %.2f\n", labels, float64(run)*0.01)
		fmt.Fprintf(w, "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{%s} 100000\n", labels)
		fmt.Fprintf(w, "# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total{model_name=%q} %d\n", *model, genTotal.Load())
		fmt.Fprintf(w, "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=%q} %d\n", *model, promptTotal.Load())
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int `json:"max_tokens"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.MaxTokens <= 0 {
			req.MaxTokens = 16
		}
		running.Add(1)
		defer running.Add(-1)
		promptTotal.Add(10)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := 0; i < req.MaxTokens; i++ {
			for frozen() {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(*tokenEvery):
			}
			genTotal.Add(1)
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
			if err := rc.Flush(); err != nil {
				return
			}
		}
		fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
		rc.Flush()
	})

	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
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
	go func() {
		for range time.Tick(time.Second) {
			if n := running.Load(); n > 0 {
				logf("[TP0] Decode batch, #running-req: %d, #token: %d, token usage: 0.01, cuda graph: False, gen throughput (token/s): %.2f, #queue-req: 0, ", n, n*100, float64(n)/tokenEvery.Seconds())
			}
		}
	}()
	http.Serve(ln, mux)
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
