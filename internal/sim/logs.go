package sim

import (
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// logger writes engine-format log lines; the formats are the contract a
// log watcher parses (docs/engines.md §5), so they are not slog lines.
type logger struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func newLogger(w io.Writer) *logger {
	if w == nil {
		w = io.Discard
	}
	return &logger{w: w}
}

// sglang writes "[YYYY-MM-DD HH:MM:SS TP0] msg" (tp=true) or without the rank.
func (l *logger) sglang(tp bool, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buf[:0]
	b = append(b, '[')
	b = time.Now().AppendFormat(b, "2006-01-02 15:04:05")
	if tp {
		b = append(b, " TP0"...)
	}
	b = append(b, "] "...)
	b = fmt.Appendf(b, format, args...)
	b = append(b, '\n')
	l.w.Write(b)
	l.buf = b
}

// vllm writes "LEVEL MM-DD HH:MM:SS [file.py:line] msg".
func (l *logger) vllm(level, file, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buf[:0]
	b = append(b, level...)
	b = append(b, ' ')
	b = time.Now().AppendFormat(b, "01-02 15:04:05")
	b = append(b, " ["...)
	b = append(b, file...)
	b = append(b, "] "...)
	b = fmt.Appendf(b, format, args...)
	b = append(b, '\n')
	l.w.Write(b)
	l.buf = b
}

// raw writes text as is (tracebacks).
func (l *logger) raw(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	io.WriteString(l.w, s)
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func itoa(n int) string { return strconv.Itoa(n) }

// crashText is the traceback a scheduler prints before SIGQUIT, by error kind.
func crashText(engine, kind string) string {
	var last string
	switch kind {
	case "oom":
		last = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 93.90 GiB memory in use. Of the allocated memory 88.12 GiB is allocated by PyTorch, and 3.51 GiB is reserved by PyTorch but unallocated."
	case "nccl":
		last = "RuntimeError: NCCL error: remote process exited or there was a network error"
	default:
		last = "RuntimeError: CUDA error: an illegal memory access was encountered"
	}
	if engine == "vllm" {
		return "Traceback (most recent call last):\n" +
			"  File \"/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py\", line 701, in run_engine_core\n" +
			"    engine_core.run_busy_loop()\n" +
			"  File \"/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py\", line 728, in run_busy_loop\n" +
			"    self._process_engine_step()\n" +
			"  File \"/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py\", line 1563, in execute_model\n" +
			"    hidden_states = self.model(\n" + last + "\n"
	}
	return "Traceback (most recent call last):\n" +
		"  File \"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py\", line 2712, in run_scheduler_process\n" +
		"    scheduler.event_loop_overlap()\n" +
		"  File \"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py\", line 901, in event_loop_overlap\n" +
		"    batch_result = self.run_batch(batch)\n" +
		"  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 1811, in forward\n" +
		"    return self.forward_decode(forward_batch, pp_proxy_tensors=pp_proxy_tensors)\n" +
		last + "\n"
}
