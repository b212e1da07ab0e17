package conversation

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/regen-dev/regen/internal/llm"
)

// TestEncodeDecodeRoundTrip: every body the sources write (the bodies
// pinned by source's TestBodyGolden) decodes and encodes back to the same
// bytes, seed and dataset answers included, and its key is the body
// without them.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	f, err := os.Open("../source/testdata/bodies.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	enc := NewEncoder()
	var n, seeded, original int
	for line := 1; sc.Scan(); line++ {
		var g struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		if g.Body == nil {
			continue
		}
		p, err := Decode(g.Body)
		if err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		body, key := enc.Encode(&p.Body)
		if !bytes.Equal(body, g.Body) {
			t.Errorf("line %d: encode(decode(body)) differs\n got %s\nwant %s", line, body, g.Body)
		}
		bare := p.Body
		bare.Original, bare.Seed = nil, nil
		if want := Encode(&bare); !bytes.Equal(key, want) {
			t.Errorf("line %d: key\n got %s\nwant %s", line, key, want)
		}
		if p.Seed != nil {
			seeded++
			noSeed := p.Body
			noSeed.Seed = nil
			unseeded := Encode(&noSeed)
			if got := WithSeed(unseeded, *p.Seed); !bytes.Equal(got, g.Body) {
				t.Errorf("line %d: WithSeed\n got %s\nwant %s", line, got, g.Body)
			}
		}
		if p.Original != nil {
			original++
		}
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 30 || seeded == 0 || original == 0 {
		t.Fatalf("%d bodies, %d seeded, %d with the dataset's answers: want every kind", n, seeded, original)
	}
}

// A recorded call's id is written even when empty, content without a
// value as null, and strings without HTML escaping.
func TestEncodeFields(t *testing.T) {
	var call llm.ToolCall
	call.Type, call.Function.Name, call.Function.Arguments = "function", "f", "{}"
	b := Body{
		Messages: []Message{{Role: "user", Content: json.RawMessage(`"a <b> & c"`), Name: "n\u2028"}},
		Turns:    []Turn{{Calls: []llm.ToolCall{call}, Input: []Message{{Role: "tool", ToolCallID: "x"}}}},
	}
	got := Encode(&b)
	want := `{"messages":[{"role":"user","content":"a <b> & c","name":"n\u2028"}],` +
		`"turns":[{"calls":[{"id":"","type":"function","function":{"name":"f","arguments":"{}"}}],"input":[{"role":"tool","content":null,"tool_call_id":"x"}]}]}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	// encoding/json of the same Body gives the same bytes once HTML
	// escaping is off, but for the call's empty id, which it omits.
	b.Turns[0].Calls[0].ID = "c"
	got = Encode(&b)
	var buf bytes.Buffer
	je := json.NewEncoder(&buf)
	je.SetEscapeHTML(false)
	if err := je.Encode(b); err != nil {
		t.Fatal(err)
	}
	if std := bytes.TrimSuffix(buf.Bytes(), []byte("\n")); !bytes.Equal(std, got) {
		t.Errorf("encoding/json writes\n%s\nEncoder writes\n%s", std, got)
	}
}
