package llm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// readFixture returns a testdata file as a string.
func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeEvents writes an SSE text event by event, flushing after each one the
// way an engine flushes every token.
func writeEvents(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	f := w.(http.Flusher)
	for len(text) > 0 {
		i := strings.Index(text, "\n\n")
		if i < 0 {
			io.WriteString(w, text)
			break
		}
		io.WriteString(w, text[:i+2])
		f.Flush()
		text = text[i+2:]
	}
	f.Flush()
}

// newServer starts an httptest server on 127.0.0.1 and a client for it.
func newServer(t *testing.T, h http.HandlerFunc, cfg Config) (*httptest.Server, *Client) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a client that went away only once the body is
		// read, and blockUntilGone depends on that.
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		h(w, r)
	}))
	cfg.BaseURL = srv.URL
	c := New(cfg)
	t.Cleanup(func() {
		c.Close()
		srv.Close()
	})
	return srv, c
}

// hijacked answers with raw bytes on the connection and then closes it, to
// fake a server that dies in the middle of a response.
func hijacked(raw string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		bw.WriteString(raw)
		bw.Flush()
		conn.Close()
	}
}

// chunkedHead starts a 200 event-stream response with chunked encoding.
const chunkedHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunked frames s as one HTTP chunk.
func chunked(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// blockUntilGone waits until the client goes away.
func blockUntilGone(r *http.Request) { <-r.Context().Done() }

func testRequest() Request {
	return Request{Model: "m", Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`), MaxTokens: 64}
}

// errClass returns the class of an *Error or 0 when err is not one.
func errClass(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return 0
}

// sseLines splits an SSE fixture into its data lines, for handlers that
// write part of a stream.
func sseLines(t testing.TB, name string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(readFixture(t, name)))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") {
			out = append(out, sc.Text()+"\n\n")
		}
	}
	return out
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
