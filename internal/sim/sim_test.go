package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// syncBuffer is a log sink tests can read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testConfig is a fast server: 1000x real time, no load or warm-up, and
// the fast profile's step times the package's tests were written against.
func testConfig() Config {
	c := DefaultConfig()
	if err := c.UseProfile(ProfileFast); err != nil {
		panic(err)
	}
	c.Speed = 1000
	c.LoadTime = 0
	c.WarmupTime = 0
	c.OutputMean = 40
	c.ModelName = "m"
	return c
}

// startServer starts a server on 127.0.0.1 and waits until it is ready.
func startServer(t testing.TB, c Config) (*Server, string, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	s, err := New(c, logs)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	url, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	select {
	case <-s.Ready():
	case <-time.After(30 * time.Second):
		t.Fatalf("server not ready; logs:\n%s", logs)
	}
	return s, url, logs
}

// streamResult is what a plain SSE reader saw.
type streamResult struct {
	status       int
	content      string
	reasoning    string
	toolArgs     string
	toolName     string
	finish       string
	usage        *usage
	done         bool
	chunks       int
	badChunks    int
	err          error
	roleAssigned bool
}

func chatBody(prompt string, maxTokens int, extra string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}%s}`,
		prompt, maxTokens, extra)
}

// streamChat posts a streaming chat request and reads the SSE stream.
func streamChat(client *http.Client, url, body string) streamResult {
	var res streamResult
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return res
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			res.err = err
			return res
		}
		line = strings.TrimSpace(line)
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.done = true
			return res
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Role             *string `json:"role"`
					Content          *string `json:"content"`
					ReasoningContent *string `json:"reasoning_content"`
					ToolCalls        []struct {
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			res.badChunks++
			continue
		}
		res.chunks++
		if ch.Usage != nil {
			res.usage = ch.Usage
		}
		for _, c := range ch.Choices {
			d := c.Delta
			if d.Role != nil && *d.Role == "assistant" {
				res.roleAssigned = true
			}
			if d.Content != nil {
				res.content += *d.Content
			}
			if d.ReasoningContent != nil {
				res.reasoning += *d.ReasoningContent
			}
			for _, tc := range d.ToolCalls {
				res.toolName += tc.Function.Name
				res.toolArgs += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				res.finish = *c.FinishReason
			}
		}
	}
}

// scrape reads /metrics into name -> summed value.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				out[name] += m.Counter.GetValue()
			case m.Gauge != nil:
				out[name] += m.Gauge.GetValue()
			case m.Histogram != nil:
				out[name] += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}
