package llm

import (
	"context"
	"testing"
)

// BenchmarkChatLongBody sends a 64 KB request (a 16k-token history) and
// reports the bytes allocated per request, of which one copy of the body
// is what buildParts saves.
func BenchmarkChatLongBody(b *testing.B) {
	srv := benchServer(b)
	c := New(Config{BaseURL: srv.URL, MaxConns: 4})
	b.Cleanup(c.Close)
	req := longRequest()
	req.MaxTokens = benchChunks
	measure(b, func() int {
		res, err := c.Chat(context.Background(), req, nil)
		if err != nil {
			b.Fatal(err)
		}
		return len(res.Content) + 1
	})
}
