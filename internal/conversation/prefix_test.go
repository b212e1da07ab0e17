package conversation

import (
	"encoding/json"
	"hash/fnv"
	"testing"
)

// decodedPrefix is SharedPrefix by decoding the body with encoding/json,
// as it was done before: the reference the walk must agree with.
func decodedPrefix(body []byte) (uint64, int) {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(body, &b) != nil {
		return 0, 0
	}
	h := fnv.New64a()
	size := 0
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
		return 0, 0
	}
	return h.Sum64(), size
}

// TestSharedPrefix: for every body the sources write and for hand-made
// ones, the walk finds the key and size decoding finds.
func TestSharedPrefix(t *testing.T) {
	bodies := []string{
		glaiveBody,
		`{"messages":[{"role":"developer","content":[{"type":"text","text":"rules"}]},{"role":"system","content":"more"},{"role":"user","content":"q"},{"role":"system","content":"late"}]}`,
		`{"messages":[{"role":"user","content":"q"}],"tools":null}`,
		`{"messages":[{"role":"system","content":null}],"turns":[{"input":[{"role":"user","content":"x"}]}],"seed":1}`,
		`{"tools":[{"type":"function"}],"messages":[{"content":"s","role":"system"}]}`,
		`{"messages":[{"role":"system","content":"s"}],"tools":[1,}`,
		`{"messages":null}`,
		`not json`,
	}
	for _, g := range goldenBodies(t) {
		bodies = append(bodies, string(g.Body))
	}
	shared := 0
	for _, body := range bodies {
		key, size := SharedPrefix([]byte(body))
		wantKey, wantSize := decodedPrefix([]byte(body))
		if key != wantKey || size != wantSize {
			t.Errorf("SharedPrefix(%s) = %x, %d; want %x, %d", body, key, size, wantKey, wantSize)
		}
		if key != 0 {
			shared++
		}
	}
	if shared < 5 {
		t.Fatalf("only %d of %d bodies have a shared prefix: the cases do not exercise it", shared, len(bodies))
	}
}
