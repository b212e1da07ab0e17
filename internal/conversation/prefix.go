package conversation

import (
	"bytes"
	"errors"
	"hash/fnv"

	"github.com/regen-dev/regen/internal/rawjson"
)

// SharedPrefix identifies the part of a sample's requests that other
// samples may share word for word: its tool list and the system (or
// developer) messages before the first other message. key is 0 when the
// sample has none; size is its length in bytes. It is called for every
// claim, so it walks the body (package rawjson) instead of decoding it,
// and stops at the keys Encoder writes after messages and tools: later
// turns are not read, and the messages after the first that is not a
// system message are only checked. A body that is not a JSON object
// of that shape has no shared prefix (the request build reports it).
func SharedPrefix(body []byte) (key uint64, size int) {
	var tools, messages []byte
	err := rawjson.Object(body, func(m rawjson.Member) error {
		switch m.Key {
		case "messages":
			messages = m.Value
		case "tools":
			tools = m.Value
		case "turns", "original", "seed":
			// Encoder writes these after messages and tools: the rest of
			// the body (most of a long conversation) is not read.
			return rawjson.ErrStop
		}
		return nil
	})
	if err != nil {
		return 0, 0
	}
	h := fnv.New64a()
	if len(tools) > 0 && string(tools) != "null" {
		h.Write(tools)
		size += len(tools)
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
			size += len(content)
			return nil
		})
	}
	if err != nil || size == 0 {
		return 0, 0
	}
	return h.Sum64(), size
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
