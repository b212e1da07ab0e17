package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// canned is an OpenAI-compatible endpoint that answers every chat request
// after a fixed latency with the same short streamed answer, and 200 to
// every GET (health, metrics). It stands for a server that is never the
// bottleneck, so what a case measures is regen: claims, dispatch, the
// client and the store's commits.
type canned struct {
	srv      *httptest.Server
	latency  time.Duration
	requests atomic.Int64

	firstOnce sync.Once
	first     chan time.Time // receives the time of the first chat request
}

// The answer: a role chunk, three content chunks, a finish chunk with usage.
var cannedStream = []byte("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\n" +
	"data: [DONE]\n\n")

func newCanned(latency time.Duration) *canned {
	c := &canned{latency: latency, first: make(chan time.Time, 1)}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	return c
}

func (c *canned) URL() string { return c.srv.URL }
func (c *canned) Close()      { c.srv.Close() }

func (c *canned) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		}
		return
	}
	c.firstOnce.Do(func() { c.first <- time.Now() })
	c.requests.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	if c.latency > 0 {
		t := time.NewTimer(c.latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write(cannedStream)
}
