package sim

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCutPrompt: a cut fault cuts the stream of every request whose last
// user message holds its text, after its tokens and with no finish_reason
// or [DONE], however often it is sent; every other prompt is answered.
func TestCutPrompt(t *testing.T) {
	c := testConfig()
	c.OutputMean = 100000 // long answers, so the cut comes before the end
	c.CutPrompt = "poison"
	c.CutAfterTokens = 4
	_, url, _ := startServer(t, c)
	for i := range 3 {
		r := streamChat(http.DefaultClient, url, chatBody("a poison prompt", 50, ""))
		if r.status != 200 || r.done || r.finish != "" || !errors.Is(r.err, io.ErrUnexpectedEOF) {
			t.Errorf("cut prompt, try %d: status %d, done %v, finish %q, err %v; want a 200 stream cut without finish_reason or [DONE]",
				i+1, r.status, r.done, r.finish, r.err)
		}
		if got := len(strings.Fields(r.content)); got != 4 {
			t.Errorf("cut prompt, try %d: %d tokens before the cut, want 4", i+1, got)
		}
	}
	// The system prompt, or an earlier turn, holding the text is not the
	// last user message.
	other := `{"model":"m","messages":[{"role":"system","content":"poison"},{"role":"user","content":"poison"},` +
		`{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"fine"}]}],"max_tokens":20,"stream":true}`
	for _, body := range []string{chatBody("a fine prompt", 20, ""), other} {
		if r := streamChat(http.DefaultClient, url, body); !r.done || r.finish != "length" {
			t.Errorf("other prompt: done %v, finish %q, err %v; want a whole answer", r.done, r.finish, r.err)
		}
	}
	parts := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a "},{"type":"text","text":"poison pill"}]}],"max_tokens":20,"stream":true}`
	if r := streamChat(http.DefaultClient, url, parts); r.done || r.err == nil {
		t.Errorf("prompt in content parts: done %v, err %v; want it cut", r.done, r.err)
	}
}

// TestCutPromptCount: with a count, the cut stops after that many.
func TestCutPromptCount(t *testing.T) {
	c := testConfig()
	c.Faults = []Fault{{Kind: FaultCut, Prompt: "flaky", Count: 2}}
	_, url, _ := startServer(t, c)
	var done []bool
	for range 4 {
		done = append(done, streamChat(http.DefaultClient, url, chatBody("flaky", 20, "")).done)
	}
	if diff := cmp.Diff([]bool{false, false, true, true}, done); diff != "" {
		t.Errorf("streams done (-want +got):\n%s", diff)
	}
}

// TestThrottle: during its window a throttle answers 429 with Retry-After
// and the engine's error object; after it, the server answers again.
func TestThrottle(t *testing.T) {
	c := testConfig() // speed 1000: 1,500 simulated seconds are 1.5 s
	c.ThrottleFor = 1500 * time.Second
	c.ThrottleRetryAfter = 2 * time.Second
	s, url, _ := startServer(t, c)
	resp, body := post(t, url, chatBody("x", 5, ""))
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "2" || !strings.Contains(body, `"message":"Too Many Requests"`) {
		t.Fatalf("in the window: %d, Retry-After %q, body %s; want 429, 2 and an error object", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	refused := 1
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, _ := post(t, url, chatBody("x", 5, ""))
		if resp.StatusCode == 200 {
			break
		}
		refused++
		if time.Now().After(deadline) {
			t.Fatalf("still %d after 20 s; want the window of 1.5 s to end", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 5 {
		if r := streamChat(http.DefaultClient, url, chatBody("x", 5, "")); !r.done {
			t.Fatalf("after the window: status %d, err %v; want answers", r.status, r.err)
		}
	}
	if got := s.reqCount.Load(); got != int64(refused+6) {
		t.Errorf("requests counted = %d, want %d (refused ones count)", got, refused+6)
	}
}

// TestThrottleProbability: a throttle with a probability and no window
// refuses about that share of requests for ever (503 here, which with a
// Retry-After is backpressure too), the same ones for the same seed.
func TestThrottleProbability(t *testing.T) {
	statuses := func() []int {
		c := testConfig()
		c.Faults = []Fault{{Kind: FaultThrottle, Probability: 0.3, Status: 503, RetryAfter: 1500 * time.Millisecond}}
		_, url, _ := startServer(t, c)
		var out []int
		for range 100 {
			resp, _ := post(t, url, chatBody("x", 1, ""))
			if resp.StatusCode == 503 && resp.Header.Get("Retry-After") != "2" {
				t.Fatalf("Retry-After %q, want 2 (1.5 s rounded up)", resp.Header.Get("Retry-After"))
			}
			out = append(out, resp.StatusCode)
		}
		return out
	}
	a, b := statuses(), statuses()
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("two servers with one seed refused different requests (-first +second):\n%s", diff)
	}
	n := 0
	for _, s := range a {
		if s == 503 {
			n++
		}
	}
	if n < 15 || n > 45 {
		t.Errorf("%d of 100 refused at probability 0.3, want 15-45", n)
	}
}

// post sends a streaming chat request and reads the whole answer.
func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestCutAndThrottleConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Apply(map[string]any{"cut_prompt": "row 17", "throttle_for": "25s", "throttle_retry_after": 2}); err != nil {
		t.Fatal(err)
	}
	got, err := c.faults()
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{Kind: FaultCut, Prompt: "row 17", Tokens: 3},
		{Kind: FaultThrottle, For: 25 * time.Second, Status: 429, RetryAfter: 2 * time.Second, Probability: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("faults from the job's sim keys (-want +got):\n%s", diff)
	}
	for _, bad := range []map[string]any{
		{"kind": "cut"},
		{"kind": "throttle", "status": 500},
		{"kind": "throttle", "probability": 2},
		{"kind": "throttle", "after_requests": 3},
	} {
		if _, err := ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%v) = nil error, want one", bad)
		}
	}
}

// TestBroken: after its requests the broken fault answers every
// generation request with a 500 while /health stays healthy, and with
// --broken-for it recovers.
func TestBroken(t *testing.T) {
	tests := []struct {
		name    string
		cfg     func(c *Config)
		recover bool
	}{
		{"for ever", func(c *Config) { c.BrokenAfterRequests = 3 }, false},
		{"for a while", func(c *Config) {
			c.BrokenAfterRequests = 3
			c.BrokenFor = 1500 * time.Second
			c.BrokenMessage = "internal boom"
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig() // speed 1000: 1,500 simulated seconds are 1.5 s
			tt.cfg(&c)
			_, url, _ := startServer(t, c)
			for i := range 3 {
				if r := streamChat(http.DefaultClient, url, chatBody("x", 5, "")); !r.done {
					t.Fatalf("request %d before the fault: status %d, err %v; want an answer", i+1, r.status, r.err)
				}
			}
			for range 5 {
				resp, body := post(t, url, chatBody("x", 5, ""))
				if resp.StatusCode != 500 || !strings.Contains(body, `"message":"`+cmpOr(c.BrokenMessage, "Internal server error")+`"`) {
					t.Fatalf("broken: %d %s; want 500 with the message", resp.StatusCode, body)
				}
			}
			if resp, err := http.Get(url + "/health"); err != nil || resp.StatusCode != 200 {
				t.Errorf("/health while broken: %v %v, want 200", resp, err)
			}
			time.Sleep(1600 * time.Millisecond)
			r := streamChat(http.DefaultClient, url, chatBody("x", 5, ""))
			if r.done != tt.recover {
				t.Errorf("after 1.6 s: answered %v (status %d), want %v", r.done, r.status, tt.recover)
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
