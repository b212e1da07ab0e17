package llm

import (
	"context"
	"io"
	"net"
)

// A request body goes to the socket from its own pieces (bodyParts), in
// one writev, instead of through a copy: net/http hands a body of known
// length to the connection's ReadFrom inside an io.LimitedReader, which
// net.TCPConn copies through a new buffer of up to 32 KB per request, and
// a conversation's body is its whole history, sent again every turn.

// partsReader reads a bodyParts from its start (bodyParts.reader).
type partsReader struct {
	bufs net.Buffers
	left int64
}

func (r *partsReader) Read(p []byte) (int, error) {
	n, err := r.bufs.Read(p)
	r.left -= int64(n)
	return n, err
}

func (r *partsReader) Close() error { return nil }

// bodyConn is a client connection whose ReadFrom writes a partsReader's
// pieces as they are (net.Buffers: writev on a TCP connection).
type bodyConn struct{ net.Conn }

// ReadFrom writes what r holds to the connection. r is what net/http
// gives it: the request body, limited to its Content-Length; any other
// reader takes the connection's own way.
func (c bodyConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if pr, ok := lr.R.(*partsReader); ok && pr.left == lr.N {
			n, err := pr.bufs.WriteTo(c.Conn)
			pr.left -= n
			lr.N -= n
			return n, err
		}
	}
	return io.Copy(c.Conn, r)
}

// bodyDialer dials with dial and hands out bodyConns.
func bodyDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return bodyConn{conn}, nil
	}
}
