// Package llmtest holds stand-in servers for tests of package llm and of
// its callers: small, real HTTP servers on 127.0.0.1 that misbehave the way
// a given engine does, where the simulator (internal/sim) does not.
package llmtest

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ClosingServer answers every streamed chat completion the way llama.cpp's
// llama-server was seen to (issue 22): its headers say
// "Keep-Alive: timeout=5", yet it closes the connection after every
// streamed answer. It closes at the worst moment: it waits up to a few
// milliseconds for the client's next request on that connection and, when
// one starts arriving, closes without answering it, so a client that reuses
// the connection sees EOF or a reset before any byte of an answer.
type ClosingServer struct {
	URL string
	// Answered counts streamed answers; Dropped counts requests that
	// arrived on a connection the server then closed without answering.
	Answered, Dropped atomic.Int64

	chunks int
	ln     net.Listener
	wg     sync.WaitGroup
}

// NewClosingServer starts a ClosingServer on 127.0.0.1 streaming chunks
// content chunks per answer; it stops when tb's test ends.
func NewClosingServer(tb testing.TB, chunks int) *ClosingServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &ClosingServer{URL: "http://" + ln.Addr().String(), chunks: chunks, ln: ln}
	s.wg.Add(1)
	go s.accept()
	tb.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *ClosingServer) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close()
			s.serve(conn)
		}()
	}
}

// serve answers one request on conn, then lingers for the next one and
// drops it.
func (s *ClosingServer) serve(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	io.Copy(io.Discard, req.Body)
	req.Body.Close()
	bw := bufio.NewWriter(conn)
	bw.WriteString("HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/event-stream\r\n" +
		"Keep-Alive: timeout=5, max=100\r\nTransfer-Encoding: chunked\r\n\r\n")
	event := func(s string) {
		fmt.Fprintf(bw, "%x\r\n%s\r\n", len(s), s)
		bw.Flush()
	}
	for i := range s.chunks {
		event(fmt.Sprintf(`data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"tok%d "},"finish_reason":null}]}`+"\n\n", i))
	}
	event(`data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n")
	event(fmt.Sprintf(`data: {"object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", s.chunks, 5+s.chunks))
	event("data: [DONE]\n\n")
	bw.WriteString("0\r\n\r\n")
	if bw.Flush() != nil {
		return
	}
	s.Answered.Add(1)
	// Race the client's next request: close as soon as it starts to come,
	// or after a moment if it does not.
	conn.SetReadDeadline(time.Now().Add(time.Duration(rand.IntN(3000)) * time.Microsecond))
	if _, err := br.ReadByte(); err == nil {
		s.Dropped.Add(1)
	}
}
