//go:build unix

package llm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const benchChunks = 500

// benchStream is 500 SGLang-shaped content chunks, a finish chunk, a usage
// chunk and [DONE], one event per flush as SGLang writes them.
func benchStream() []string {
	var ev []string
	for i := 0; i < benchChunks; i++ {
		ev = append(ev, fmt.Sprintf(`data: {"id":"6f1c0c6e2b0a4c4e9a1b","object":"chat.completion.chunk","created":1765432100,"model":"kimi-k2.5",`+
			`"choices":[{"index":0,"delta":{"role":null,"content":" tok%d","reasoning_content":null,"tool_calls":null},`+
			`"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`+"\n\n", i))
	}
	ev = append(ev,
		`data: {"id":"6f1c0c6e2b0a4c4e9a1b","object":"chat.completion.chunk","created":1765432100,"model":"kimi-k2.5",`+
			`"choices":[{"index":0,"delta":{"role":null,"content":"","reasoning_content":null,"tool_calls":null},`+
			`"logprobs":null,"finish_reason":"stop","matched_stop":163586}],"usage":null}`+"\n\n",
		`data: {"id":"6f1c0c6e2b0a4c4e9a1b","object":"chat.completion.chunk","created":1765432100,"model":"kimi-k2.5",`+
			`"choices":[],"usage":{"prompt_tokens":21,"total_tokens":521,"completion_tokens":500,"prompt_tokens_details":null,"reasoning_tokens":0}}`+"\n\n",
		"data: [DONE]\n\n")
	return ev
}

func benchServer(b *testing.B) *httptest.Server {
	events := benchStream()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, e := range events {
			io.WriteString(w, e)
			f.Flush()
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}

// cpuTime is this process's user+system CPU time; it includes the test
// server's share, which is the same for every client.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs fn b.N times and reports per-chunk wall and CPU time.
func measure(b *testing.B, fn func() int) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for b.Loop() {
		if n := fn(); n == 0 {
			b.Fatal("read nothing")
		}
	}
	cpu := cpuTime() - cpu0
	chunks := float64(b.N * benchChunks)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/chunks, "ns/chunk")
	b.ReportMetric(float64(cpu.Nanoseconds())/chunks, "cpu-ns/chunk")
}

func BenchmarkStream(b *testing.B) {
	b.Run("floor", func(b *testing.B) {
		// Server plus transport with no parsing at all: what every client pays.
		srv := benchServer(b)
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
		b.Cleanup(hc.CloseIdleConnections)
		measure(b, func() int {
			resp, err := hc.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return int(n)
		})
	})
	b.Run("handwritten", func(b *testing.B) {
		srv := benchServer(b)
		c := New(Config{BaseURL: srv.URL, MaxConns: 4})
		b.Cleanup(c.Close)
		req := testRequest()
		req.MaxTokens = benchChunks // the stream's budget allows it
		measure(b, func() int {
			res, err := c.Chat(context.Background(), req, nil)
			if err != nil {
				b.Fatal(err)
			}
			return len(res.Content) + len(res.ReasoningContent)
		})
	})
	b.Run("openai-go", func(b *testing.B) {
		srv := benchServer(b)
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
		b.Cleanup(hc.CloseIdleConnections)
		client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("none"),
			option.WithMaxRetries(0), option.WithHTTPClient(hc))
		params := openai.ChatCompletionNewParams{
			Model:     "m",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			MaxTokens: openai.Int(benchChunks),
		}
		measure(b, func() int {
			stream := client.Chat.Completions.NewStreaming(context.Background(), params)
			var content, reasoning strings.Builder
			for stream.Next() {
				ch := stream.Current()
				if len(ch.Choices) == 0 {
					continue
				}
				d := ch.Choices[0].Delta
				content.WriteString(d.Content)
				if f, ok := d.JSON.ExtraFields["reasoning_content"]; ok && f.Raw() != "null" {
					reasoning.WriteString(f.Raw())
				}
			}
			if err := stream.Err(); err != nil {
				b.Fatal(err)
			}
			stream.Close()
			return content.Len() + reasoning.Len()
		})
	})
}
