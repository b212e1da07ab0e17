package engine

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLogLine(t *testing.T) {
	none := LogEvent{Running: -1, Queued: -1, Tokens: -1, TokenUsage: -1, GenThroughput: -1, Retracted: -1, MaxTotalTokens: -1}
	with := func(f func(*LogEvent)) LogEvent {
		ev := none
		f(&ev)
		return ev
	}
	tests := []struct {
		name string
		line string
		want LogEvent
	}{
		{
			name: "decode batch, comma form (docs/engines.md §5)",
			line: "[2026-09-13 16:06:04] Decode batch, #running-req: 67, #token: 81316, token usage: 0.93, cuda graph: False, gen throughput (token/s): 2663.43, #queue-req: 9",
			want: with(func(e *LogEvent) {
				e.Kind, e.Phase = Batch, "decode"
				e.Running, e.Tokens, e.TokenUsage, e.GenThroughput, e.Queued = 67, 81316, 0.93, 2663.43, 9
				e.Fields = map[string]string{"#running-req": "67", "#token": "81316", "token usage": "0.93", "cuda graph": "False", "gen throughput (token/s)": "2663.43", "#queue-req": "9"}
			}),
		},
		{
			name: "decode batch, period form and trailing separator",
			line: "[2025-01-02 10:00:00 TP0] Decode batch. #running-req: 3, #token: 1200, token usage: 0.05, gen throughput (token/s): 88.10, #queue-req: 0, ",
			want: with(func(e *LogEvent) {
				e.Kind, e.Phase = Batch, "decode"
				e.Running, e.Tokens, e.TokenUsage, e.GenThroughput, e.Queued = 3, 1200, 0.05, 88.10, 0
				e.Fields = map[string]string{"#running-req": "3", "#token": "1200", "token usage": "0.05", "gen throughput (token/s)": "88.10", "#queue-req": "0"}
			}),
		},
		{
			name: "decode batch with forward iteration",
			line: "[2025-01-02 10:00:00 TP0] Decode batch [1234], #running-req: 1, #token: 10, token usage: 0.00, cuda graph: True, gen throughput (token/s): 5.00, #queue-req: 2, ",
			want: with(func(e *LogEvent) {
				e.Kind, e.Phase = Batch, "decode"
				e.Running, e.Tokens, e.TokenUsage, e.GenThroughput, e.Queued = 1, 10, 0, 5, 2
				e.Fields = map[string]string{"#running-req": "1", "#token": "10", "token usage": "0.00", "cuda graph": "True", "gen throughput (token/s)": "5.00", "#queue-req": "2"}
			}),
		},
		{
			name: "prefill batch",
			line: "[2026-09-13 16:06:01 TP0] Prefill batch, #new-seq: 2, #new-token: 4096, #cached-token: 128, token usage: 0.41, #running-req: 65, #queue-req: 11, ",
			want: with(func(e *LogEvent) {
				e.Kind, e.Phase = Batch, "prefill"
				e.Running, e.TokenUsage, e.Queued = 65, 0.41, 11
				e.Fields = map[string]string{"#new-seq": "2", "#new-token": "4096", "#cached-token": "128", "token usage": "0.41", "#running-req": "65", "#queue-req": "11"}
			}),
		},
		{
			name: "prefill batch, period form",
			line: "Prefill batch. #new-seq: 1, #new-token: 12, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ",
			want: with(func(e *LogEvent) {
				e.Kind, e.Phase = Batch, "prefill"
				e.Running, e.TokenUsage, e.Queued = 0, 0, 0
				e.Fields = map[string]string{"#new-seq": "1", "#new-token": "12", "#cached-token": "0", "token usage": "0.00", "#running-req": "0", "#queue-req": "0"}
			}),
		},
		{
			name: "retraction",
			line: "[2026-09-13 16:06:05 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 646, #new_token_ratio: 0.0980 -> 0.3487",
			want: with(func(e *LogEvent) {
				e.Kind, e.Retracted = Retract, 1
				e.Fields = map[string]string{"#retracted_reqs": "1", "#new_tokens_gained": "646", "#new_token_ratio": "0.0980 -> 0.3487"}
			}),
		},
		{
			name: "retraction, older form",
			line: "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000",
			want: with(func(e *LogEvent) {
				e.Kind, e.Retracted = Retract, 1
				e.Fields = map[string]string{"#retracted_reqs": "1", "#new_token_ratio": "0.9998 -> 1.0000"}
			}),
		},
		{
			name: "ready",
			line: "[2026-09-13 15:59:59] The server is fired up and ready to roll!",
			want: with(func(e *LogEvent) { e.Kind = Ready }),
		},
		{
			name: "capacity",
			line: "[2026-09-13 15:58:10 TP0] max_total_num_tokens=231120, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=262144",
			want: with(func(e *LogEvent) { e.Kind, e.MaxTotalTokens = Capacity, 231120 }),
		},
		{
			name: "vllm stats",
			line: "INFO 06-11 11:46:30 [loggers.py:118] Engine 000: Avg prompt throughput: 512.3 tokens/s, Avg generation throughput: 1840.5 tokens/s, Running: 24 reqs, Waiting: 3 reqs, GPU KV cache usage: 87.5%, Prefix cache hit rate: 12.0%",
			want: with(func(e *LogEvent) {
				e.Kind, e.Phase = Batch, "stats"
				e.GenThroughput, e.Running, e.Queued, e.TokenUsage = 1840.5, 24, 3, 0.875
			}),
		},
		{name: "plain line", line: "[2026-09-13 16:06:04] INFO:     127.0.0.1:50000 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK", want: none},
		{name: "empty", line: "", want: none},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseLogLine(tt.line)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseLogLine(%q) mismatch (-want +got):\n%s", tt.line, diff)
			}
		})
	}
}

func TestParseLogLineFatal(t *testing.T) {
	tests := []struct {
		line  string
		cause string
	}{
		{"[2025-03-29 18:56:25 TP0] Scheduler hit an exception: Traceback (most recent call last):", CauseSchedulerException},
		{"[2025-03-29 18:56:25 TP0] DataParallelController hit an exception: Traceback (most recent call last):", CauseSchedulerException},
		{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 95.00 GiB of which 1.10 GiB is free.", CauseCUDAOOM},
		{"torch.cuda.OutOfMemoryError: Allocation on device", CauseCUDAOOM},
		{"[2025-03-29 18:56:26] Received sigquit from a child process. It usually means the child failed.", CauseChildFailed},
		{"[2025-03-29 18:56:26] SIGQUIT received. signum=None, frame=None. It usually means one child failed.", CauseChildFailed},
		{"[2025-03-29 18:56:26] Child process unexpectedly failed with an exit code 9. pid=4242", CauseChildFailed},
		{"[2025-03-29 18:56:25 TP3] Watchdog timeout (self.watchdog_timeout=300)", CauseWatchdog},
		{"[2025-03-29 18:56:25 TP3] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", CauseWatchdog},
		{"[2025-03-29 18:56:25] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. tic start time: 18:56:05. last_heartbeat time: 18:55:40", CauseHealthCheckFailed},
		{"RuntimeError: NCCL error: remote process exited or there was a network error", CauseNCCL},
		{"[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=123, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.", CauseNCCL},
		{"[rank3]:[E ProcessGroupNCCL.cpp:1182] To avoid data inconsistency, we are taking the entire process down.", CauseNCCL},
		{"[2025-03-29 18:56:25] Initialization failed. warmup error: Traceback (most recent call last):", CauseInitFailed},
		{"(EngineCore_0 pid=2651) ERROR 06-11 11:46:39 [core.py:517] EngineCore encountered a fatal error.", CauseEngineDead},
		{"vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.", CauseEngineDead},
		{"ERROR: Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.", CauseEngineDead},
		{"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}", CauseInitFailed},
		{"torch.AcceleratorError: CUDA error: an illegal memory access was encountered", CauseCUDAError},
		{"src/llama.cpp:3504: GGML_ASSERT(cell.has_seq_id(seq_id)) failed", CauseAssert},
		{"CUDA error: out of memory", CauseCUDAOOM},
		{"ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: cudaMalloc failed: out of memory", CauseCUDAOOM},
		{"E srv  llama_server: exiting due to model loading error", CauseLoadFailed},
		{"terminate called after throwing an instance of 'c10::DistBackendError'", CauseAbort},
	}
	for _, tt := range tests {
		got := ParseLogLine(tt.line)
		if got.Kind != Fatal || got.Cause != tt.cause {
			t.Errorf("ParseLogLine(%q) = kind %v cause %q, want fatal %q", tt.line, got.Kind, got.Cause, tt.cause)
		}
	}
}

func TestCausePriority(t *testing.T) {
	order := []string{CauseCUDAOOM, CauseSchedulerException, CauseChildFailed, "exit"}
	for i := 1; i < len(order); i++ {
		if CausePriority(order[i-1]) <= CausePriority(order[i]) {
			t.Errorf("CausePriority(%q)=%d, want > CausePriority(%q)=%d", order[i-1], CausePriority(order[i-1]), order[i], CausePriority(order[i]))
		}
	}
}

func BenchmarkParseLogLine(b *testing.B) {
	lines := []string{
		"[2026-09-13 16:06:04] Decode batch, #running-req: 67, #token: 81316, token usage: 0.93, cuda graph: False, gen throughput (token/s): 2663.43, #queue-req: 9",
		"[2026-09-13 16:06:04] INFO:     127.0.0.1:50000 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
	}
	for _, l := range lines {
		b.Run(l[22:34], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ParseLogLine(l)
			}
		})
	}
}
