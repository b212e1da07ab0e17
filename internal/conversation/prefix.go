package conversation

import (
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
	key, size, _ = Shape(body)
	return key, size
}

// Shape is SharedPrefix and the number of turns the sample's plan has
// (Plan.NumTurns; 0 when the body does not decode), read in one pass: a
// sample of more than one turn is a conversation whose history a server
// keeps between its turns.
func Shape(body []byte) (key uint64, size, turns int) {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools json.RawMessage `json:"tools"`
		Turns []struct{}      `json:"turns"`
	}
	if json.Unmarshal(body, &b) != nil {
		return 0, 0, 0
	}
	turns = 1 + len(b.Turns)
	h := fnv.New64a()
	if len(b.Tools) > 0 && string(b.Tools) != "null" {
		h.Write(b.Tools)
		size += len(b.Tools)
	}
	for _, m := range b.Messages {
		if m.Role != "system" && m.Role != "developer" {
			break
		}
		h.Write([]byte{0})
		h.Write(m.Content)
		size += len(m.Content)
	}
	if size == 0 {
		return 0, 0, turns
	}
	return h.Sum64(), size, turns
}
