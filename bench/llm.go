package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/regen-dev/regen/internal/llm"
)

const llmChunks = 500 // content chunks per stream

// sglangEvents is one canned SGLang stream: a role chunk, llmChunks content
// chunks, a finish chunk, a usage chunk and [DONE], as SGLang shapes them.
func sglangEvents() []string {
	const head = `data: {"id":"6f1c0c6e2b0a4c4e9a1b","object":"chat.completion.chunk","created":1765432100,"model":"kimi-k2.5",`
	ev := []string{head + `"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}` + "\n\n"}
	for i := range llmChunks {
		ev = append(ev, fmt.Sprintf(head+`"choices":[{"index":0,"delta":{"role":null,"content":" tok%d","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`+"\n\n", i))
	}
	return append(ev,
		head+`"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":163586}],"usage":null}`+"\n\n",
		head+fmt.Sprintf(`"choices":[],"usage":{"prompt_tokens":21,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0},"reasoning_tokens":0}}`, 21+llmChunks, llmChunks)+"\n\n",
		"data: [DONE]\n\n")
}

// benchLLM compares the CPU one streamed chunk costs through llm.Client
// with net/http reading the same stream line by line without parsing. Both
// figures include the in-process server writing the stream, which is the
// same for both.
func benchLLM(ctx context.Context, o opts) (outcome, error) {
	events := sglangEvents()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, e := range events {
			io.WriteString(w, e)
			f.Flush()
		}
	}))
	defer srv.Close()

	c := llm.New(llm.Config{BaseURL: srv.URL, MaxConns: 4})
	defer c.Close()
	regen := func(n int) error { return chatStreams(ctx, c, n) }
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	br := bufio.NewReaderSize(nil, 16<<10)
	ref := func(n int) error { return splitStreams(ctx, hc, br, srv.URL, 2*len(events), n) }

	streams, rounds := 300, 3
	if o.quick {
		streams, rounds = 100, 2
	}
	// Warm both paths (connections, pools) before measuring.
	if err := regen(5); err != nil {
		return outcome{}, err
	}
	if err := ref(5); err != nil {
		return outcome{}, err
	}
	best, err := bestStreamRounds(rounds, streams, regen, ref)
	if err != nil {
		return outcome{}, err
	}
	chunks := float64(streams * llmChunks)
	perChunk := func(s span) float64 { return float64(s.cpu.Nanoseconds()) / chunks / 1e3 }
	allocs := func(s span) float64 { return float64(s.mallocs) / chunks }
	const note = "net/http + bufio line split, no JSON"
	return outcome{
		rows: []row{
			{name: "llm stream CPU", unit: "cpu-µs/chunk", better: "lower", regen: perChunk(best[0]), ref: perChunk(best[1]), note: note},
			{name: "llm stream allocs", unit: "allocs/chunk", better: "lower", regen: allocs(best[0]), ref: allocs(best[1]), note: note},
		},
		detail: []string{fmt.Sprintf("%d streams x %d content chunks per round, best of %d rounds; in-process server CPU included on both sides (wall %.1f vs %.1f ms per stream)",
			streams, llmChunks, rounds, float64(best[0].wall.Microseconds())/1e3/float64(streams), float64(best[1].wall.Microseconds())/1e3/float64(streams))},
	}, nil
}

// bestStreamRounds alternates regen's and the reference's rounds of
// streams and keeps the round of each that took least CPU: other tenants of
// the machine only ever add time.
func bestStreamRounds(rounds, streams int, regen, ref func(int) error) ([2]span, error) {
	var best [2]span
	for r := range rounds {
		for i, fn := range []func(int) error{regen, ref} {
			s0 := startSpan()
			if err := fn(streams); err != nil {
				return best, err
			}
			s := s0.end()
			if r == 0 || s.cpu < best[i].cpu {
				best[i] = s
			}
		}
	}
	return best, nil
}

var llmBody = json.RawMessage(`{"messages":[{"role":"user","content":"Explain TCP congestion control in simple terms."}]}`)

// chatStreams is regen's side: n chats through llm.Client, each checked
// for every delta, its usage and its finish reason.
func chatStreams(ctx context.Context, c *llm.Client, n int) error {
	req := llm.Request{Model: "kimi-k2.5", Body: llmBody, MaxTokens: 1000}
	for range n {
		deltas := 0
		res, err := c.Chat(ctx, req, func(int) { deltas++ })
		if err != nil {
			return fmt.Errorf("chat: %w", err)
		}
		if deltas != llmChunks || res.Usage.CompletionTokens != llmChunks || res.FinishReason != "stop" {
			return fmt.Errorf("chat: got %d deltas, usage %d, finish %q; want %d, %d, stop", deltas, res.Usage.CompletionTokens, res.FinishReason, llmChunks, llmChunks)
		}
	}
	return nil
}

// The reference sends the same request bytes regen would (roughly) and
// splits the body into lines, which any SSE reader must do.
const llmRefBody = `{"max_tokens":1000,"messages":[{"role":"user","content":"Explain TCP congestion control in simple terms."}],"model":"kimi-k2.5","stream":true,"stream_options":{"include_usage":true}}`

// splitStreams is the reference: n posts whose bodies it only splits into
// lines, checking each has wantLines.
func splitStreams(ctx context.Context, hc *http.Client, br *bufio.Reader, base string, wantLines, n int) error {
	for range n {
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(llmRefBody))
		if err != nil {
			return err
		}
		hreq.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(hreq)
		if err != nil {
			return fmt.Errorf("reference post: %w", err)
		}
		br.Reset(resp.Body)
		lines := 0
		for {
			_, err := br.ReadSlice('\n')
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err != nil {
				break
			}
			lines++
		}
		resp.Body.Close()
		if lines != wantLines {
			return fmt.Errorf("reference read %d lines, want %d", lines, wantLines)
		}
	}
	return nil
}
