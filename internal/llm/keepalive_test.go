package llm

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/regen-dev/regen/internal/llm/llmtest"
)

// TestChatKeepAliveRace is issue 22's tenth fault at the client: a server
// that closes the connection after every streamed answer (llama-server,
// whose headers still say Keep-Alive) while the client sends its next
// request on it. 1,000 requests from 8 workers: none fails, and the server
// did drop requests on closing connections (so the race was run).
func TestChatKeepAliveRace(t *testing.T) {
	const n, workers = 1000, 8
	srv := llmtest.NewClosingServer(t, 3)
	c := New(Config{BaseURL: srv.URL, MaxConns: workers})
	t.Cleanup(c.Close)
	var next, failed atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= n {
				res, err := c.Chat(bg(t), testRequest(), nil)
				if err == nil && res.Content != "tok0 tok1 tok2 " {
					err = &Error{Class: Malformed, Msg: "content " + res.Content}
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					firstErr = cmpOr(firstErr, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Errorf("%d of %d requests failed, want 0; first: %v", failed.Load(), n, firstErr)
	}
	if srv.Dropped.Load() == 0 {
		t.Errorf("the server dropped no request on a closing connection: the race was not run")
	}
	if c.Replays() < srv.Dropped.Load() {
		t.Errorf("Replays() = %d, want at least the %d requests the server dropped", c.Replays(), srv.Dropped.Load())
	}
	t.Logf("%d requests, %d errors; the server answered %d and dropped %d on closing connections; the client replayed %d",
		n, failed.Load(), srv.Answered.Load(), srv.Dropped.Load(), c.Replays())
}

// TestKeepAliveRaceFailsAPlainClient: the stand-in reproduces the fault.
// net/http without an Idempotency-Key does not replay a POST whose reused
// connection the server closed, so some requests fail.
func TestKeepAliveRaceFailsAPlainClient(t *testing.T) {
	srv := llmtest.NewClosingServer(t, 3)
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	failed := 0
	for range 200 {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions", bytes.NewReader([]byte(`{}`)))
		resp, err := hc.Do(req)
		if err != nil {
			failed++
			continue
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
	}
	if failed == 0 {
		t.Errorf("a plain client saw no error in 200 requests; the stand-in does not race")
	}
	t.Logf("a plain net/http client: %d of 200 requests failed", failed)
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
