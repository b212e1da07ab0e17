package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// longRequest is a request whose messages (a 16k-token history, 64 KB)
// are far over bigValue.
func longRequest() Request {
	content := strings.Repeat("many words of a long history ", 64<<10/29)
	return Request{Model: "m", MaxTokens: 64, Params: map[string]json.RawMessage{"temperature": json.RawMessage("0.5")},
		Body: []byte(`{"messages":[{"role":"user","content":"` + content + `"}],"tools":[]}`)}
}

// TestBuildPartsLeavesLongHistoryInPlace: the pieces of a long request
// make the bytes encoding/json would write, and the history among them is
// the caller's own bytes (a change to them shows), not a copy.
func TestBuildPartsLeavesLongHistoryInPlace(t *testing.T) {
	req := longRequest()
	parts, err := buildParts(req, []string{"return_token_ids"})
	if err != nil {
		t.Fatal(err)
	}
	want := encodingJSONBody(t, req, []string{"return_token_ids"})
	if got := bytes.Join(parts, nil); !bytes.Equal(got, want) {
		t.Fatalf("pieces joined differ from encoding/json's body:\n got %.200s\nwant %.200s", got, want)
	}
	if parts.size() != int64(len(want)) {
		t.Errorf("size() = %d, want %d", parts.size(), len(want))
	}
	var copied int
	for _, p := range parts {
		if len(p) < bigValue {
			copied += len(p)
		}
	}
	if copied > 256 {
		t.Errorf("%d bytes of the body were copied, want only the small keys and values", copied)
	}
	i := bytes.Index(req.Body, []byte("history"))
	req.Body[i] = 'H'
	if !bytes.Contains(bytes.Join(parts, nil), []byte("History")) {
		t.Errorf("a change to the caller's history does not show in the pieces: they hold a copy")
	}
}

// TestChatSendsLongBodyWhole: a long request reaches the server whole,
// with its Content-Length, on a new connection and on a reused one.
func TestChatSendsLongBodyWhole(t *testing.T) {
	req := longRequest()
	want, err := buildBody(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, c, bodies := bodyServer(t)
	for range 2 {
		if _, err := c.Chat(bg(t), req, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(bodies()); n != 2 {
		t.Fatalf("the server read %d requests, want 2", n)
	}
	for i, b := range bodies() {
		if !bytes.Equal(b.read, want) || b.length != int64(len(want)) {
			t.Errorf("request %d: server read %d bytes, Content-Length %d; want the %d bytes of the body", i, len(b.read), b.length, len(want))
		}
	}
}

// readBody is what a server read of one request: its body and its
// Content-Length.
type readBody struct {
	read   []byte
	length int64
}

// bodyServer serves every chat request with a short answer and records
// the bodies it read; the client has one connection, so the second
// request reuses the first's.
func bodyServer(t *testing.T) (*httptest.Server, *Client, func() []readBody) {
	var mu sync.Mutex
	var got []readBody
	srv, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, readBody{b, r.ContentLength})
		mu.Unlock()
		writeEvents(w, readFixture(t, "sglang_plain.sse"))
	}, Config{MaxConns: 1})
	return srv, c, func() []readBody {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// writeRecorder is a connection that records the slices written to it.
type writeRecorder struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, p)
	w.mu.Unlock()
	return w.Conn.Write(p)
}

// TestLongBodyGoesOutFromItsPieces: a long request's history goes to the
// connection as the caller's own bytes, in one write, on a new connection
// and on a reused one; net/http alone would copy it through a buffer of
// at most 32 KB per request. The client's connections are bodyConns.
func TestLongBodyGoesOutFromItsPieces(t *testing.T) {
	req := longRequest()
	want, err := buildBody(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, c, bodies := bodyServer(t)
	conn, err := c.tr.DialContext(bg(t), "tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if _, ok := conn.(bodyConn); !ok {
		t.Fatalf("the client dials %T, want a bodyConn", conn)
	}
	rec := &writeRecorder{}
	dial := c.tr.DialContext
	c.tr.DialContext = bodyDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		rec.Conn = conn.(bodyConn).Conn
		return rec, nil
	})
	for range 2 {
		if _, err := c.Chat(bg(t), req, nil); err != nil {
			t.Fatal(err)
		}
	}
	messages := req.Body[len(`{"messages":`):bytes.LastIndex(req.Body, []byte(`,"tools"`))]
	rec.mu.Lock()
	defer rec.mu.Unlock()
	whole := 0
	for _, w := range rec.writes {
		if len(w) == len(messages) && unsafe.SliceData(w) == unsafe.SliceData(messages) {
			whole++
		}
	}
	if whole != 2 {
		t.Errorf("the history went out whole from the caller's bytes in %d of 2 requests (%d writes)", whole, len(rec.writes))
	}
	if n := len(bodies()); n != 2 {
		t.Fatalf("the server read %d requests, want 2", n)
	}
	for i, b := range bodies() {
		if !bytes.Equal(b.read, want) {
			t.Errorf("request %d: the server read %d bytes, want the %d of the body", i, len(b.read), len(want))
		}
	}
}

// TestMemberPiecesAreSentAsTheyAre: a member given in pieces makes the
// bytes the same member in one slice makes, and its long pieces go out as
// the caller's own bytes, not copies.
func TestMemberPiecesAreSentAsTheyAre(t *testing.T) {
	long := bytes.Repeat([]byte("x"), 2*bigValue)
	msgs := [][]byte{[]byte(`[{"role":"user","content":"`), long, []byte(`"},{"role":"assistant","content":"a"}`), []byte(`,{"role":"user","content":"`), long, []byte(`"}]`)}
	whole := Request{Model: "m", MaxTokens: 5, Members: []Member{{Key: "messages", Value: bytes.Join(msgs, nil)}, {Key: "seed", Value: []byte("3")}}}
	pieced := whole
	pieced.Members = []Member{{Key: "messages", Pieces: msgs}, {Key: "seed", Value: []byte("3")}}
	want, err := buildBody(whole, nil)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := buildParts(pieced, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := bytes.Join(parts, nil); !bytes.Equal(got, want) {
		t.Fatalf("pieces sent as\n%s\nwant\n%s", got, want)
	}
	own := 0
	for _, p := range parts {
		if len(p) == len(long) && unsafe.SliceData(p) == unsafe.SliceData(long) {
			own++
		}
	}
	if own != 2 {
		t.Errorf("%d of the 2 long pieces sent as the caller's bytes, want both", own)
	}
	if got := pieced.Members[0].Bytes(); !bytes.Equal(got, whole.Members[0].Value) {
		t.Errorf("Member.Bytes() = %s, want the pieces joined", got)
	}
}
