package llm

import (
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// endless streams chunk for ever, as a server that ignores max_tokens
// does, and counts what it wrote until the client went away.
func endless(chunk string, written *atomic.Int64, gone chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		defer close(gone)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			f.Flush()
			written.Add(1)
		}
	}
}

func contentChunk(text string) string {
	return `data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"` + text + `"},"finish_reason":null}]}` + "\n\n"
}

// TestChatEndlessStreamIsCut is issue 22's seventh fault: a server that
// ignores max_tokens and streams 64 KB chunks for ever. The call ends with
// a Retryable error naming the budget, the connection is closed (the
// server sees the client go), and the client allocates a bounded amount
// however long the server would go on.
func TestChatEndlessStreamIsCut(t *testing.T) {
	var written atomic.Int64
	gone := make(chan struct{})
	_, c := newServer(t, endless(contentChunk(strings.Repeat("x", 64<<10)), &written, gone), Config{RequestTimeout: 20 * time.Second})
	req := testRequest() // max_tokens 64: a byte budget of 1 MiB + 4 KiB
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := c.Chat(bg(t), req, nil)
	runtime.ReadMemStats(&after)
	if got := errClass(err); got != Retryable {
		t.Fatalf("class = %v, want %v (err: %v)", got, Retryable, err)
	}
	for _, want := range []string{"bytes of answer", "max_tokens 64", "does not stop at max_tokens"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the server still streams 10 s after the call returned: the connection was not closed")
	}
	// The budget is about 17 chunks of 64 KB; what the client allocates
	// for them (decoded strings, the growing answer, the line buffer) is a
	// few MB. Without the cut it grows until the request timeout.
	alloc := after.TotalAlloc - before.TotalAlloc
	if alloc > 24<<20 {
		t.Errorf("allocated %d MiB during the call, want under 24 MiB", alloc>>20)
	}
	t.Logf("cut after the server wrote %d chunks of 64 KB; %.1f MiB allocated during the call", written.Load(), float64(alloc)/(1<<20))
}

// TestChatStreamPastMaxTokens: small chunks for ever hit the chunk budget
// (max_tokens plus half again, at least 256) rather than the byte one.
func TestChatStreamPastMaxTokens(t *testing.T) {
	var written atomic.Int64
	gone := make(chan struct{})
	_, c := newServer(t, endless(contentChunk(" tok"), &written, gone), Config{RequestTimeout: 20 * time.Second})
	req := testRequest()
	req.MaxTokens = 1000
	deltas := 0
	_, err := c.Chat(bg(t), req, func(n int) { deltas += n })
	if got := errClass(err); got != Retryable {
		t.Fatalf("class = %v, want %v (err: %v)", got, Retryable, err)
	}
	if !strings.Contains(err.Error(), "1501 chunks, more than max_tokens 1000 allows (1500)") {
		t.Errorf("error %q does not name the chunk budget", err)
	}
	if deltas != 1500 {
		t.Errorf("onDelta saw %d chunks, want 1500 (the budget)", deltas)
	}
	<-gone
}

// TestChatBudgetKeepsHonestStreams: a stream that stops at max_tokens is
// not cut, even with more chunks than tokens (a reasoning parser sends a
// token's text in two chunks where thinking ends) and with long tokens.
func TestChatBudgetKeepsHonestStreams(t *testing.T) {
	const maxTokens = 300
	var events strings.Builder
	for i := range maxTokens {
		if i%10 == 0 {
			events.WriteString(`data: {"choices":[{"index":0,"delta":{"reasoning_content":"r"}}]}` + "\n\n")
		}
		events.WriteString(contentChunk(strings.Repeat("c", 48)))
	}
	events.WriteString(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n" + "data: [DONE]\n\n")
	_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) { writeEvents(w, events.String()) }, Config{})
	req := testRequest()
	req.MaxTokens = maxTokens
	res, err := c.Chat(bg(t), req, nil)
	if err != nil {
		t.Fatalf("Chat: %v, want the whole answer", err)
	}
	if len(res.Content) != 48*maxTokens || len(res.ReasoningContent) != maxTokens/10 || res.FinishReason != "length" {
		t.Errorf("got %d bytes of content, %d of reasoning, finish %q; want %d, %d, length",
			len(res.Content), len(res.ReasoningContent), res.FinishReason, 48*maxTokens, maxTokens/10)
	}
}

func TestNewBudget(t *testing.T) {
	tests := []struct {
		maxTokens int
		want      budget
	}{
		{0, budget{bytes: 32 << 20}},
		{-1, budget{bytes: 32 << 20}},
		// Plus half again, never fewer than 256 chunks over (README, Dispatch).
		{64, budget{maxTokens: 64, chunks: 64 + 256, bytes: 1<<20 + 64*64}},
		{256, budget{maxTokens: 256, chunks: 512, bytes: 1<<20 + 64*256}},
		{512, budget{maxTokens: 512, chunks: 768, bytes: 1<<20 + 64*512}},
		{1000, budget{maxTokens: 1000, chunks: 1500, bytes: 1<<20 + 64*1000}},
		{10240, budget{maxTokens: 10240, chunks: 15360, bytes: 1<<20 + 64*10240}},
	}
	for _, tt := range tests {
		if got := newBudget(tt.maxTokens); got != tt.want {
			t.Errorf("newBudget(%d) = %+v, want %+v", tt.maxTokens, got, tt.want)
		}
	}
}

// TestChatNonTokensAreCut is issue 29's fourth fault: a server that streams
// nothing but SSE comments, or data chunks with empty content, for ever.
// Every byte that carries no token counts against the stream's byte
// budget: the call ends with a ServerDown error wrapping ErrNoProgress
// (whose fault it is, the dispatcher judges), the connection is closed,
// and the client allocates a bounded amount.
func TestChatNonTokensAreCut(t *testing.T) {
	tests := []struct {
		name, chunk string
	}{
		{"keep-alive comments", ": keepalive " + strings.Repeat("k", 20) + "\n\n"},
		{"empty content chunks", `data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}` + "\n\n"},
		{"other fields and blank lines", "event: ping\nid: 7\n\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var written atomic.Int64
			gone := make(chan struct{})
			_, c := newServer(t, endless(tt.chunk, &written, gone), Config{RequestTimeout: 30 * time.Second})
			req := testRequest() // max_tokens 64: a byte budget of 1 MiB + 4 KiB
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := c.Chat(bg(t), req, nil)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if got := errClass(err); got != ServerDown || !errors.Is(err, ErrNoProgress) {
				t.Fatalf("err = %v (class %v), want ServerDown wrapping ErrNoProgress", err, got)
			}
			if !strings.Contains(err.Error(), "carried no token") || !strings.Contains(err.Error(), "max_tokens 64") {
				t.Errorf("error %q does not say what was cut and why", err)
			}
			select {
			case <-gone:
			case <-time.After(10 * time.Second):
				t.Fatal("the server still streams 10 s after the call returned: the connection was not closed")
			}
			sent := written.Load() * int64(len(tt.chunk))
			if budget := int64(1<<20 + 64*64); sent < budget {
				t.Errorf("cut after the server wrote %d bytes, want at least the budget %d", sent, budget)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			if alloc > 24<<20 {
				t.Errorf("allocated %d MiB during the call, want under 24 MiB", alloc>>20)
			}
			t.Logf("cut after %s: the server wrote %d bytes (%d writes); %.1f MiB allocated during the call",
				took.Round(time.Millisecond), sent, written.Load(), float64(alloc)/(1<<20))
		})
	}
}

// TestChatKeepAlivesBesideTokens: an honest stream with a comment and an
// empty chunk between its tokens is not cut by the non-token budget.
func TestChatKeepAlivesBesideTokens(t *testing.T) {
	const maxTokens = 300
	var events strings.Builder
	events.WriteString(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n")
	for range maxTokens {
		events.WriteString(": keep-alive\n\n")
		events.WriteString(`data: {"choices":[{"index":0,"delta":{"content":""}}]}` + "\n\n")
		events.WriteString(contentChunk("tok"))
	}
	events.WriteString(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n" + "data: [DONE]\n\n")
	_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) { writeEvents(w, events.String()) }, Config{})
	req := testRequest()
	req.MaxTokens = maxTokens
	res, err := c.Chat(bg(t), req, nil)
	if err != nil {
		t.Fatalf("Chat: %v, want the whole answer", err)
	}
	if len(res.Content) != 3*maxTokens || res.FinishReason != "length" {
		t.Errorf("got %d bytes of content, finish %q; want %d, length", len(res.Content), res.FinishReason, 3*maxTokens)
	}
}
