package conversation

import (
	"bytes"
	"encoding/json"
	"hash/fnv"
)

// SharedPrefix identifies the part of a sample's requests that other
// samples may share word for word: its tool list and the system (or
// developer) messages before the first other message. key is 0 when the
// sample has none; size is its length in bytes. It reads only those
// fields, so it is cheap enough to call for every claim, and a body that
// does not decode has no shared prefix (the request build reports it).
func SharedPrefix(body []byte) (key uint64, size int) {
	sh := ShapeOf(body)
	return sh.PrefixKey, sh.PrefixBytes
}

// Shape is what balancing reads of a sample's body in one pass.
type Shape struct {
	PrefixKey   uint64 // SharedPrefix's key
	PrefixBytes int    // its size in bytes, as stored (JSON)
	// PrefixText is about its size as text: the stored bytes less one per
	// JSON escape, the length a prompt's token estimate counts.
	PrefixText int
	// Turns is the number of turns of the sample's plan (Plan.NumTurns;
	// 0 when the body does not decode): a sample of more than one is a
	// conversation whose history a server keeps between its turns.
	Turns int
}

// ShapeOf reads body's Shape.
func ShapeOf(body []byte) Shape {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools json.RawMessage `json:"tools"`
		Turns []struct{}      `json:"turns"`
	}
	if json.Unmarshal(body, &b) != nil {
		return Shape{}
	}
	sh := Shape{Turns: 1 + len(b.Turns)}
	h := fnv.New64a()
	if len(b.Tools) > 0 && string(b.Tools) != "null" {
		h.Write(b.Tools)
		sh.PrefixBytes += len(b.Tools)
		sh.PrefixText += len(b.Tools)
	}
	for _, m := range b.Messages {
		if m.Role != "system" && m.Role != "developer" {
			break
		}
		h.Write([]byte{0})
		h.Write(m.Content)
		sh.PrefixBytes += len(m.Content)
		sh.PrefixText += len(m.Content) - bytes.Count(m.Content, []byte{'\\'})
	}
	if sh.PrefixBytes > 0 {
		sh.PrefixKey = h.Sum64()
	}
	return sh
}
