package conversation

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
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
	h := newPrefixHash()
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

// ShapeOf reads the shared prefix (as SharedPrefix), its size as text
// (one byte less per JSON escape) and the plan's number of turns.
func TestShapeOf(t *testing.T) {
	sys := `{"name": "fn", "description": "line one` + "\n" + `line two"}`
	b := &Body{
		Messages: []Message{{Role: "system", Content: mustJSON(t, sys)}, {Role: "user", Content: mustJSON(t, "hi")}},
		Turns:    []Turn{{Input: []Message{{Role: "user", Content: mustJSON(t, "more")}}}, {Input: []Message{{Role: "user", Content: mustJSON(t, "again")}}}},
	}
	body := Encode(b)
	sh := ShapeOf(body)
	key, size := SharedPrefix(body)
	if sh.PrefixKey != key || sh.PrefixBytes != size || key == 0 {
		t.Errorf("shape %+v, SharedPrefix %d %d: want the same non-zero key and size", sh, key, size)
	}
	if want := len(sys) + 2; sh.PrefixText != want { // the text and its two quotes
		t.Errorf("prefix text %d bytes (stored %d), want %d", sh.PrefixText, sh.PrefixBytes, want)
	}
	if sh.Turns != 3 {
		t.Errorf("turns %d, want 3", sh.Turns)
	}
	if got := ShapeOf([]byte("not json")); got != (Shape{}) {
		t.Errorf("shape of a bad body %+v, want zero", got)
	}
	if got := ShapeOf(Encode(&Body{Messages: []Message{{Role: "user", Content: mustJSON(t, "q")}}})); got.Turns != 1 || got.PrefixKey != 0 {
		t.Errorf("single-turn body without a system prompt: %+v, want 1 turn, no prefix", got)
	}
}

func mustJSON(t *testing.T, s string) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPlanShapeIsShapeOf: the shape read from a decoded plan is the one
// ShapeOf walks out of its body, for every golden body and for bodies
// with keys out of Encoder's order, repeated keys, nulls and escapes.
func TestPlanShapeIsShapeOf(t *testing.T) {
	bodies := [][]byte{
		[]byte(glaiveBody),
		[]byte(`{"messages":[{"role":"system","content":"a\"b\\c"},{"role":"developer","content":"d"},{"role":"user","content":"u"},{"role":"system","content":"late"}],"tools":null}`),
		[]byte(`{"seed":3,"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"tools":[{"type":"function"}]}`),
		[]byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"turns":[{"input":[{"role":"user","content":"x"}]}],"turns":[{"input":[{"role":"user","content":"y"}]}]}`),
		[]byte(`{"messages":[{"role":null,"content":"s"},{"role":"user","content":"u"}]}`),
		[]byte(`{"messages":[{"role":"system"},{"role":"user","content":"u"}],"original":[[{"role":"assistant","content":"a"}]]}`),
		[]byte(`{"messages" : [ {"role":"system","content":"s"} , {"role":"user","content":"u"} ] }`),
	}
	for _, g := range goldenBodies(t) {
		bodies = append(bodies, g.Body)
	}
	prefixed := 0
	for _, body := range bodies {
		p, err := Decode(body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got, want := p.Shape(), ShapeOf(body)
		if got != want {
			t.Errorf("%s: plan shape %+v, ShapeOf %+v", body, got, want)
		}
		if want.PrefixKey != 0 {
			prefixed++
		}
	}
	if prefixed < 5 {
		t.Fatalf("%d bodies with a shared prefix: the cases do not exercise it", prefixed)
	}
}

// TestPrefixKeyIsTheSameInEveryProcess: a prefix's key picks its home
// endpoint for every worker of a job and after a restart, so it is a fixed
// function of the prefix's bytes (xxhash of the tools, then a zero byte and
// the content of each leading system message), not of a process's seed.
func TestPrefixKeyIsTheSameInEveryProcess(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"f"}}]`
	body := `{"messages":[{"role":"system","content":"be brief"},{"role":"developer","content":[{"type":"text","text":"rules"}]},{"role":"user","content":"q"}],"tools":` + tools + `}`
	fed := tools + "\x00" + `"be brief"` + "\x00" + `[{"type":"text","text":"rules"}]`
	const golden uint64 = 0x8ae4e0042bbcf924
	want := xxhash.Sum64String(fed)
	if want != golden {
		t.Fatalf("xxhash of the prefix = %#x, want the golden %#x (a key must not change between releases)", want, golden)
	}
	if key, _ := SharedPrefix([]byte(body)); key != want {
		t.Errorf("SharedPrefix key = %#x, want %#x", key, want)
	}
	p, err := Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if key := p.Shape().PrefixKey; key != want {
		t.Errorf("Plan.Shape key = %#x, want %#x", key, want)
	}
}

// BenchmarkSharedPrefix: the key of a conversation's 32 KB system prompt,
// read on its first turn.
func BenchmarkSharedPrefix(b *testing.B) {
	sys, err := json.Marshal(strings.Repeat("You are a careful assistant. ", 32<<10/29))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"messages":[{"role":"system","content":` + string(sys) + `},{"role":"user","content":"q"}]}`)
	b.SetBytes(int64(len(sys)))
	b.ReportAllocs()
	for b.Loop() {
		if key, _ := SharedPrefix(body); key == 0 {
			b.Fatal("no prefix key")
		}
	}
}
