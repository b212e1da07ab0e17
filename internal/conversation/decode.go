package conversation

import (
	"encoding/json"
	"errors"

	"github.com/regen-dev/regen/internal/rawjson"
)

// errFallBack makes walkBody give up: the body has a key or a value shape
// the walk does not read exactly as encoding/json would (a key in other
// case, a field of another type); Decode then decodes it with encoding/json.
var errFallBack = errors.New("decode with encoding/json")

// walkBody reads a body the way json.Unmarshal into Body does, for the
// bodies Encoder writes, walking it (package rawjson) instead of decoding
// it: Decode runs for every turn of every conversation, and its history
// is most of the body. Raw fields are slices of body. The body is checked
// once, by the outer walk (object: rawjson.Object), or not at all when the
// store vouches for it (rawjson.CheckedObject: DecodeStored); the walks
// inside it only find boundaries.
// w.compact reports that no value of the body holds whitespace outside its
// strings: every raw value of it is as encoding/json writes it; w.ordered
// that its keys are in Encoder's order without repeats (so ShapeOf reads
// the same members the walk kept: Plan.Shape).
func walkBody(body []byte, object func([]byte, func(rawjson.Member) error) error) (b Body, w walked, err error) {
	w = walked{compact: true, ordered: true}
	seen := map[string]bool{}
	err = object(body, func(m rawjson.Member) error {
		var err error
		w.compact = w.compact && !m.Spaced
		if seen[m.Key] || (m.Key != "original" && m.Key != "seed" && (seen["original"] || seen["seed"])) {
			w.ordered = false
		}
		seen[m.Key] = true
		switch m.Key {
		case "messages":
			b.Messages, err = walkMessages(m.Value)
		case "tools":
			b.Tools = json.RawMessage(m.Value)
		case "turns":
			b.Turns, err = walkTurns(m.Value)
		case "original":
			b.Original = nil
			if string(m.Value) != "null" {
				err = rawjson.CheckedArray(m.Value, func(run []byte) error {
					msgs, err := walkMessages(run)
					b.Original = append(b.Original, msgs)
					return err
				})
			}
		case "seed":
			b.Seed = nil
			err = json.Unmarshal(m.Value, &b.Seed)
		default:
			return errFallBack
		}
		return err
	})
	return b, w, err
}

// walked is what walkBody learnt of a body beside its contents.
type walked struct{ compact, ordered bool }

func walkTurns(v []byte) ([]Turn, error) {
	if string(v) == "null" {
		return nil, nil
	}
	turns := []Turn{}
	err := rawjson.CheckedArray(v, func(elem []byte) error {
		var t Turn
		err := rawjson.CheckedObject(elem, func(m rawjson.Member) error {
			switch m.Key {
			case "calls":
				t.Calls = nil
				return json.Unmarshal(m.Value, &t.Calls)
			case "input":
				var err error
				t.Input, err = walkMessages(m.Value)
				return err
			}
			return errFallBack
		})
		turns = append(turns, t)
		return err
	})
	return turns, err
}

func walkMessages(v []byte) ([]Message, error) {
	if string(v) == "null" {
		return nil, nil
	}
	msgs := []Message{}
	err := rawjson.CheckedArray(v, func(elem []byte) error {
		var m Message
		err := rawjson.CheckedObject(elem, func(f rawjson.Member) error {
			switch f.Key {
			case "content":
				m.Content = json.RawMessage(f.Value)
				return nil
			case "tool_calls":
				m.ToolCalls = json.RawMessage(f.Value)
				return nil
			case "role":
				return walkString(f, &m.Role)
			case "name":
				return walkString(f, &m.Name)
			case "tool_call_id":
				return walkString(f, &m.ToolCallID)
			case "reasoning_content":
				return walkString(f, &m.ReasoningContent)
			}
			return errFallBack
		})
		msgs = append(msgs, m)
		return err
	})
	return msgs, err
}

// walkString reads a string field; null leaves it as it is.
func walkString(f rawjson.Member, s *string) error {
	if string(f.Value) == "null" {
		return nil
	}
	if f.Value[0] != '"' {
		return errFallBack
	}
	var err error
	*s, err = f.Text()
	return err
}
