package conversation

import (
	"bytes"
	"errors"

	"github.com/cespare/xxhash/v2"

	"github.com/regen-dev/regen/internal/rawjson"
)

// SharedPrefix identifies the part of a sample's requests that other
// samples may share word for word: its tool list and the system (or
// developer) messages before the first other message. key is 0 when the
// sample has none; size is its length in bytes. A key is the same in every
// process and release (newPrefixHash): it picks the prefix's home endpoint
// (dispatch's rendezvous), which every worker sharing a job, and a worker
// after a restart, must agree on. A body that is not a JSON object of that
// shape has no shared prefix (the request build reports it).
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

// ShapeOf reads body's Shape. It is called for every claim, so it walks
// the body (package rawjson) instead of decoding it, and stops at the keys
// Encoder writes after messages, tools and turns: the dataset's original
// answers (most of a long conversation) are not read, and the messages
// after the first that is not a system message are only checked.
func ShapeOf(body []byte) Shape {
	var tools, messages []byte
	turns := 0
	err := rawjson.Object(body, func(m rawjson.Member) error {
		switch m.Key {
		case "messages":
			messages = m.Value
		case "tools":
			tools = m.Value
		case "turns":
			if string(m.Value) == "null" {
				return nil
			}
			return rawjson.CheckedArray(m.Value, func([]byte) error { turns++; return nil })
		case "original", "seed":
			return rawjson.ErrStop
		}
		return nil
	})
	if err != nil {
		return Shape{}
	}
	sh := Shape{Turns: 1 + turns}
	h := newPrefixHash()
	if len(tools) > 0 && string(tools) != "null" {
		h.Write(tools)
		sh.PrefixBytes += len(tools)
		sh.PrefixText += len(tools)
	}
	if len(messages) > 0 && string(messages) != "null" {
		err = rawjson.CheckedArray(messages, func(msg []byte) error {
			role, content, err := roleContent(msg)
			if err != nil {
				return err
			}
			if role != "system" && role != "developer" {
				return rawjson.ErrStop
			}
			h.Write([]byte{0})
			h.Write(content)
			sh.PrefixBytes += len(content)
			sh.PrefixText += len(content) - bytes.Count(content, []byte{'\\'})
			return nil
		})
	}
	if err != nil {
		return Shape{}
	}
	if sh.PrefixBytes > 0 {
		sh.PrefixKey = h.Sum64()
	}
	return sh
}

// Shape is ShapeOf(body) for the body p was decoded from, read from the
// decoded plan instead of walking the body again when the body's keys are
// in Encoder's order (a dispatcher decodes a claimed sample once for both).
func (p *Plan) Shape() Shape {
	if !p.ordered {
		return ShapeOf(p.raw)
	}
	sh := Shape{Turns: p.NumTurns()}
	h := newPrefixHash()
	if len(p.Tools) > 0 {
		h.Write(p.Tools)
		sh.PrefixBytes += len(p.Tools)
		sh.PrefixText += len(p.Tools)
	}
	for _, m := range p.Messages {
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

// newPrefixHash hashes a prefix key: xxhash has no seed, so a key is the
// same in every process (hash/maphash's per-process seed is not), and it
// reads a long system prompt twenty times faster than FNV-1a did, a pass
// over it on every conversation's first turn (32 KB: 33.4 -> 1.55 µs;
// maphash took 2.8).
func newPrefixHash() *xxhash.Digest {
	return xxhash.New()
}

var errNotMessage = errors.New("not a message")

// roleContent reads a message's role and its content's raw bytes.
func roleContent(msg []byte) (role string, content []byte, err error) {
	err = rawjson.CheckedObject(msg, func(m rawjson.Member) error {
		switch m.Key {
		case "role":
			if bytes.Equal(m.Value, []byte("null")) {
				return nil
			}
			if m.Value[0] != '"' {
				return errNotMessage
			}
			var terr error
			role, terr = m.Text()
			return terr
		case "content":
			content = m.Value
		}
		return nil
	})
	return role, content, err
}
