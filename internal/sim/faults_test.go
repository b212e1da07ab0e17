package sim

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func waitCrash(t *testing.T, s *Server, logs *syncBuffer) int {
	t.Helper()
	select {
	case code := <-s.Crashed():
		return code
	case <-time.After(20 * time.Second):
		t.Fatalf("no crash; logs:\n%s", logs)
		return 0
	}
}

func TestCrashFaults(t *testing.T) {
	tests := []struct {
		name     string
		fault    Fault
		wantCode int
		wantLogs []string
		noLogs   []string
	}{
		{"after requests oom", Fault{Kind: FaultCrash, AfterRequests: 2, Error: "oom", ExitCode: 3}, 3,
			[]string{"Scheduler hit an exception: Traceback", "torch.OutOfMemoryError: CUDA out of memory", "Received sigquit from a child process. It usually means the child failed."}, nil},
		{"after requests nccl", Fault{Kind: FaultCrash, AfterRequests: 2, Error: "nccl"}, 1,
			[]string{"Scheduler hit an exception", "NCCL error: remote process exited", "Received sigquit"}, nil},
		{"abrupt mid-stream", Fault{Kind: FaultCrash, AfterTokens: 30, Error: "abrupt"}, 137,
			nil, []string{"Scheduler hit an exception", "Received sigquit"}},
		{"kv usage", Fault{Kind: FaultCrash, KVAbove: 0.001, KVFor: 100 * time.Millisecond}, 1,
			[]string{"Scheduler hit an exception"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			c.OutputMean = 100000 // every stream runs to max_tokens
			c.Faults = []Fault{tt.fault}
			s, url, logs := startServer(t, c)
			results := make(chan streamResult, 2)
			for range 2 {
				go func() { results <- streamChat(http.DefaultClient, url, chatBody("crash me", 100000, "")) }()
			}
			if got := waitCrash(t, s, logs); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d", got, tt.wantCode)
			}
			for range 2 {
				r := <-results
				if r.done || (r.err == nil && r.status == 200) {
					t.Errorf("stream ended cleanly (%+v); want it cut by the crash", r)
				}
			}
			if _, err := http.Get(url + "/v1/models"); err == nil {
				t.Errorf("GET after crash succeeded; want connection refused")
			}
			for _, want := range tt.wantLogs {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("logs lack %q:\n%s", want, logs)
				}
			}
			for _, no := range tt.noLogs {
				if strings.Contains(logs.String(), no) {
					t.Errorf("logs contain %q, want none:\n%s", no, logs)
				}
			}
		})
	}
}

func TestCrashAfterTime(t *testing.T) {
	c := testConfig()
	c.CrashAt = 2 * time.Second
	c.CrashExitCode = 9
	s, _, logs := startServer(t, c)
	if got := waitCrash(t, s, logs); got != 9 {
		t.Errorf("exit code = %d, want 9", got)
	}
}

func TestHangHealthAndWatchdog(t *testing.T) {
	c := testConfig()
	c.Faults = []Fault{{Kind: FaultHang, AfterTokens: 5}}
	c.WatchdogTimeout = 120 * time.Second
	c.OutputMean = 100000
	s, url, logs := startServer(t, c)
	results := make(chan streamResult, 1)
	go func() { results <- streamChat(http.DefaultClient, url, chatBody("hang", 100000, "")) }()
	for !s.sched.stuck.Load() {
		time.Sleep(time.Millisecond)
	}
	// The health probe fails after HealthTimeout (20 s simulated) and logs it.
	if got := getStatus(t, url+"/health"); got != 503 {
		t.Errorf("/health during hang = %d, want 503", got)
	}
	if !strings.Contains(logs.String(), "Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.") {
		t.Errorf("logs lack the health check failure:\n%s", logs)
	}
	if got := getStatus(t, url+"/v1/models"); got != 200 {
		t.Errorf("/v1/models during hang = %d, want 200", got)
	}
	// The watchdog turns the hang into a crash.
	waitCrash(t, s, logs)
	if !strings.Contains(logs.String(), "Watchdog timeout (self.watchdog_timeout=120)") {
		t.Errorf("logs lack the watchdog line:\n%s", logs)
	}
	if r := <-results; r.done {
		t.Errorf("hung stream completed; want it cut")
	}
}

func TestHangRecovers(t *testing.T) {
	c := testConfig()
	c.Faults = []Fault{{Kind: FaultHang, AfterRequests: 1, For: 5 * time.Second}}
	_, url, _ := startServer(t, c)
	r := streamChat(http.DefaultClient, url, chatBody("pause", 50, ""))
	if !r.done || r.err != nil {
		t.Fatalf("stream after a finite hang: done=%v err=%v; want completed", r.done, r.err)
	}
	if got := getStatus(t, url+"/health"); got != 200 {
		t.Errorf("/health after the hang = %d, want 200", got)
	}
}

func TestZombie(t *testing.T) {
	for _, engine := range []string{"sglang", "vllm"} {
		t.Run(engine, func(t *testing.T) {
			c := testConfig()
			c.Engine = engine
			c.ZombieAfterRequest = 1
			_, url, logs := startServer(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(chatBody("anyone?", 50, "")))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("zombie accepted no request: %v", err)
			}
			buf := make([]byte, 64<<10)
			n, _ := readAll(resp.Body, buf)
			resp.Body.Close()
			if strings.Contains(string(buf[:n]), `"content":" `) {
				t.Errorf("zombie streamed tokens: %q", buf[:n])
			}
			if got := getStatus(t, url+"/v1/models"); got != 200 {
				t.Errorf("/v1/models = %d, want 200", got)
			}
			if got := getStatus(t, url+"/health"); got != 503 {
				t.Errorf("/health = %d, want 503", got)
			}
			if strings.Contains(logs.String(), "Traceback") {
				t.Errorf("zombie logged a traceback; want silence")
			}
		})
	}
}

func readAll(r interface{ Read([]byte) (int, error) }, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestErrorBurst(t *testing.T) {
	for _, status := range []int{500, 503} {
		c := testConfig()
		c.Faults = []Fault{{Kind: FaultError, AfterRequests: 1, Count: 2, Status: status}}
		_, url, _ := startServer(t, c)
		var got []int
		for range 4 {
			got = append(got, streamChat(http.DefaultClient, url, chatBody("x", 5, "")).status)
		}
		if diff := cmp.Diff([]int{200, status, status, 200}, got); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
	}
}

func TestResetMidStream(t *testing.T) {
	c := testConfig()
	c.OutputMean = 100000
	c.Faults = []Fault{{Kind: FaultReset, Count: 1, Tokens: 7}}
	_, url, _ := startServer(t, c)
	r := streamChat(http.DefaultClient, url, chatBody("reset", 50, ""))
	if r.done || !errors.Is(r.err, syscall.ECONNRESET) {
		t.Errorf("first stream: done=%v err=%v; want a connection reset", r.done, r.err)
	}
	if got := len(strings.Fields(r.content)); got != 7 {
		t.Errorf("tokens before the reset = %d, want 7", got)
	}
	if r := streamChat(http.DefaultClient, url, chatBody("reset", 50, "")); !r.done {
		t.Errorf("second stream: err=%v; want it complete (count 1)", r.err)
	}
}

func TestMalformedChunk(t *testing.T) {
	c := testConfig()
	c.MalformedCount = 1
	c.MalformedAfterTok = 3
	_, url, _ := startServer(t, c)
	r := streamChat(http.DefaultClient, url, chatBody("bad json", 20, ""))
	if r.badChunks != 1 || !r.done {
		t.Errorf("bad chunks = %d, done = %v; want 1 malformed chunk in a completed stream", r.badChunks, r.done)
	}
}

func TestSlowFault(t *testing.T) {
	simFor := func(slow float64) time.Duration {
		c := testConfig()
		// At a lower speed the real-time gaps around the request (scaled
		// into simulated idle time) stay small next to the decode time, even
		// on a loaded machine or under -race.
		c.Speed = 50
		c.SlowFactor = slow
		c.OutputMean = 100000
		s, url, _ := startServer(t, c)
		start := s.sched.simClock.Load()
		if r := streamChat(http.DefaultClient, url, chatBody("slow", 200, "")); !r.done {
			t.Fatalf("stream: %v", r.err)
		}
		return time.Duration(s.sched.simClock.Load() - start)
	}
	fast, slow := simFor(0), simFor(5)
	if slow < 3*fast {
		t.Errorf("simulated duration with slow factor 5 = %v, without = %v; want at least 3x", slow, fast)
	}
}

func TestStartupHealth(t *testing.T) {
	c := testConfig()
	c.WarmupTime = time.Hour // 3.6 s real at speed 1000: /health must say 503 meanwhile
	s, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	url, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if got := getStatus(t, url+"/health"); got != 503 {
		t.Errorf("/health while starting = %d, want 503", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s2, _ := New(testConfig(), nil)
	defer s2.Close()
	if _, err := s2.Start(ctx, "127.0.0.1:0"); !errors.Is(err, context.Canceled) {
		t.Errorf("Start with a cancelled context = %v, want context.Canceled", err)
	}
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestLoadScenario(t *testing.T) {
	got, err := LoadScenario("testdata/scenario.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{Kind: FaultCrash, AfterRequests: 500, Error: "oom", ExitCode: 3},
		{Kind: FaultHang, At: 60 * time.Second, For: 30 * time.Second},
		{Kind: FaultError, AfterRequests: 10, Count: 5, Status: 500},
		{Kind: FaultReset, Count: 2, Tokens: 10},
		{Kind: FaultMalformed, Count: 1, Tokens: 3},
		{Kind: FaultSlow, At: 10 * time.Second, Factor: 4, For: 20 * time.Second},
		{Kind: FaultZombie, AfterTokens: 1000},
		{Kind: FaultCrash, KVAbove: 0.95, KVFor: 30 * time.Second, Error: "abrupt", ExitCode: 137},
		{Kind: FaultCut, Prompt: "row 17", Tokens: 5},
		{Kind: FaultThrottle, At: 10 * time.Second, For: 25 * time.Second, Status: 429, RetryAfter: 2 * time.Second, Probability: 0.5},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("scenario (-want +got):\n%s", diff)
	}
	for _, bad := range []map[string]any{{"kind": "explode"}, {"kind": "crash", "when": 3}, {"kind": "error", "status": 302}} {
		if _, err := ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%v) = nil error, want one", bad)
		}
	}
}
