package conversation

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/rawjson"
)

// TestEncodeDecodeRoundTrip: every body the sources write (the bodies
// pinned by source's TestBodyGolden) decodes and encodes back to the same
// bytes, seed and dataset answers included, and its key is the body
// without them.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	enc := NewEncoder()
	var n, seeded, original int
	for _, g := range goldenBodies(t) {
		line := g.line
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

// TestRequestBytes: for every body the sources write and every turn of
// it, Request writes the bytes encoding/json writes for the request (the
// history with the model's answers, the tools and the seed).
func TestRequestBytes(t *testing.T) {
	var turns int
	for _, g := range goldenBodies(t) {
		line := g.line
		p, err := Decode(g.Body)
		if err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		// Answers that let every turn follow: the recorded calls where the
		// dataset has them, text with characters JSON and HTML escape
		// otherwise.
		var answers []llm.Result
		for k := range p.NumTurns() {
			res := llm.Result{Content: fmt.Sprintf("answer %d: <b> & \"q\" \u2028 é\n", k), ReasoningContent: "think <", FinishReason: "stop"}
			if k < len(p.Turns) && len(p.Turns[k].Calls) > 0 {
				res = llm.Result{ToolCalls: p.Turns[k].Calls}
			}
			answers = append(answers, res)
		}
		for k := range p.NumTurns() {
			for _, keep := range []bool{false, true} {
				got, err := p.Request(k, answers[:k], keep)
				if err != nil {
					t.Fatalf("line %d turn %d: %v", line, k, err)
				}
				want := g.Body
				if k > 0 || len(p.Turns) > 0 || p.Original != nil {
					msgs, err := p.build(answers[:k], keep, true)
					if err != nil {
						t.Fatal(err)
					}
					want, _ = encode(request{Messages: msgs, Tools: p.Tools, Seed: p.Seed})
				}
				if !bytes.Equal(got, want) {
					t.Errorf("line %d turn %d keep=%v:\n got %s\nwant %s", line, k, keep, got, want)
				}
				turns++
			}
		}
	}
	if turns < 60 {
		t.Fatalf("%d requests compared: the golden file did not load", turns)
	}
}

// TestWalkBody: Decode walks a body instead of decoding it; for every body
// the sources write and for bodies with nulls, escapes, unknown keys and
// keys in other case, the walk gives what json.Unmarshal gives (or gives
// way to it).
func TestWalkBody(t *testing.T) {
	bodies := []string{
		glaiveBody,
		`{"messages":[{"role":"us\u0065r","content":null,"name":null,"reasoning_content":"r\n"}],"tools":null,"turns":null,"original":null,"seed":null}`,
		`{"messages":[],"turns":[{"calls":null,"input":[{"role":"user","content":[{"type":"text","text":"x"}]}]}],"original":[[],[{"role":"assistant","content":"a","tool_calls":[{"id":"c"}]}]],"seed":-3}`,
		`{"Messages":[{"role":"user","content":"x"}]}`,
		`{"messages":[{"ROLE":"user","content":"x"}],"extra":1}`,
		`{"messages":[{"role":1,"content":"x"}]}`,
		`{"messages":[{"role":"user","content":"x"}],"messages":[{"role":"system","content":"y"}]}`,
		"{\"messages\":[{\"role\":\"us\xffer\",\"content\":\"x\"}]}",
	}
	for _, g := range goldenBodies(t) {
		bodies = append(bodies, string(g.Body))
	}
	walked := 0
	for _, body := range bodies {
		var want Body
		wantErr := json.Unmarshal([]byte(body), &want)
		got, _, err := walkBody([]byte(body), rawjson.Object)
		if err != nil {
			continue // Decode falls back to encoding/json
		}
		walked++
		if wantErr != nil {
			t.Errorf("walkBody(%s) succeeded where encoding/json fails: %v", body, wantErr)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("walkBody(%s) (-json.Unmarshal +walk):\n%s", body, diff)
		}
	}
	if walked < 30 {
		t.Fatalf("only %d of %d bodies walked", walked, len(bodies))
	}
}

// TestDecodeStored: a body the store hands back is split without being
// checked again, into the plan Decode makes of it (every golden body and
// the odd shapes TestWalkBody reads); a body the split cannot read gets
// Decode's error, which says where it is wrong; one whose strings alone
// are corrupt is not checked (the server refuses it:
// TestCorruptStoredBodyIsDeadLettered).
func TestDecodeStored(t *testing.T) {
	bodies := []string{
		`{"messages":[{"role":"us\u0065r","content":null,"name":null,"reasoning_content":"r\n"}],"tools":null,"turns":null,"original":null,"seed":null}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"turns":[{"calls":null,"input":[{"role":"user","content":"y"}]}],"seed":-3}`,
		`{"messages":[{"role":"user","content":"x"}],"extra":1}`,
		"{\"messages\" : [ {\"role\":\"user\", \"content\":\"x\"} ] }",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]} \n\t",
	}
	for _, g := range goldenBodies(t) {
		bodies = append(bodies, string(g.Body))
	}
	for _, body := range bodies {
		want, err := Decode([]byte(body))
		if err != nil {
			t.Fatalf("Decode(%s): %v", body, err)
		}
		got, err := DecodeStored([]byte(body))
		if err != nil {
			t.Fatalf("DecodeStored(%s): %v", body, err)
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(Plan{}, walked{})); diff != "" {
			t.Errorf("DecodeStored(%s) (-Decode +DecodeStored):\n%s", body, diff)
		}
	}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"x"}]`,
		`{"messages":[{"role":"user","content":"a "quoted" word"}]}`,
		`{"messages":[{"role":"user","content":"x"}}`,
		`{"messages":[]}`,
		`{"messages":[{"role":"user","content":"x"}]} trailing`,
		`{"messages":[{"role":"user","content":"x"}]}{"messages":[{"role":"user","content":"y"}]}`,
		`{"messages":[{"role":"user","content":"x"}]}]`,
		`{} {}`,
	} {
		_, want := Decode([]byte(body))
		_, err := DecodeStored([]byte(body))
		if want == nil || err == nil || err.Error() != want.Error() {
			t.Errorf("DecodeStored(%s): error %v, want Decode's %v", body, err, want)
		}
	}
	corrupt := `{"messages":[{"role":"user","content":"a \q escape"}]}`
	if _, err := Decode([]byte(corrupt)); err == nil {
		t.Fatalf("Decode(%s): no error", corrupt)
	}
	p, err := DecodeStored([]byte(corrupt))
	if err != nil || string(p.Messages[0].Content) != `"a \q escape"` {
		t.Errorf("DecodeStored(%s) = %v, %v: want the content as stored, unchecked", corrupt, p, err)
	}
	// A raw control character in a string is not checked either (that
	// would read every byte of the history): it is sent as stored.
	control := "{\"messages\":[{\"role\":\"user\",\"content\":\"a \x01 byte\"}]}"
	if _, err := Decode([]byte(control)); err == nil {
		t.Fatalf("Decode(%q): no error", control)
	}
	p, err = DecodeStored([]byte(control))
	if err != nil || string(p.Messages[0].Content) != "\"a \x01 byte\"" {
		t.Errorf("DecodeStored(%q) = %v, %v: want the content as stored, unchecked", control, p, err)
	}
}

// goldenBody is one body of source's testdata/bodies.golden (the bodies
// the sources write, pinned by source's TestBodyGolden) and its line.
type goldenBody struct {
	line int
	Body json.RawMessage `json:"body"`
}

// goldenBodies reads every body of source's testdata/bodies.golden.
func goldenBodies(t *testing.T) []goldenBody {
	t.Helper()
	f, err := os.Open("../source/testdata/bodies.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var out []goldenBody
	for line := 1; sc.Scan(); line++ {
		g := goldenBody{line: line}
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("bodies.golden line %d: %v", line, err)
		}
		if g.Body != nil {
			out = append(out, g)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// goldenAnswers are answers to every turn of p that let each next turn
// follow: the recorded calls where the dataset has them, text with
// characters JSON and HTML escape (and invalid UTF-8) otherwise.
func goldenAnswers(p *Plan) []llm.Result {
	var answers []llm.Result
	for k := range p.NumTurns() {
		res := llm.Result{Content: fmt.Sprintf("answer %d: <b> & \"q\" \u2028 é \xff\n", k), ReasoningContent: "think <", FinishReason: "stop"}
		if k < len(p.Turns) && len(p.Turns[k].Calls) > 0 {
			res = llm.Result{ToolCalls: p.Turns[k].Calls}
		}
		answers = append(answers, res)
	}
	return answers
}

// TestNextRequestEqualsRequest: a conversation's turn built from its turn
// before (what dispatch keeps between turns) is byte for byte the turn
// built from the body and every answer (what a restarted runner builds
// from the store), for every golden body and every turn.
func TestNextRequestEqualsRequest(t *testing.T) {
	var chained int
	for _, g := range goldenBodies(t) {
		p, err := Decode(g.Body)
		if err != nil {
			t.Fatalf("line %d: %v", g.line, err)
		}
		answers := goldenAnswers(p)
		for _, keep := range []bool{false, true} {
			prev, err := p.Request(0, nil, keep)
			if err != nil {
				t.Fatalf("line %d turn 0: %v", g.line, err)
			}
			for k := 1; k < p.NumTurns(); k++ {
				got, err := p.NextRequest(prev, k-1, answers[k-1], keep)
				if err != nil {
					t.Fatalf("line %d turn %d keep=%v: %v", g.line, k, keep, err)
				}
				want, err := p.Request(k, answers[:k], keep)
				if err != nil {
					t.Fatalf("line %d turn %d: %v", g.line, k, err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("line %d turn %d keep=%v:\n got %s\nwant %s", g.line, k, keep, got, want)
				}
				prev = got
				chained++
			}
			if _, err := p.NextRequest(prev, p.NumTurns()-1, answers[p.NumTurns()-1], keep); err == nil {
				t.Errorf("line %d: a request after the last turn was built", g.line)
			}
		}
	}
	if chained < 20 {
		t.Fatalf("%d turns chained: the golden file has too few conversations", chained)
	}
}

// TestNextPartsEqualsRequest: a conversation's turns built in pieces from
// the turn before (NextParts, what dispatch keeps between turns) join to
// the request built from the body and every answer, for every golden body
// and turn; no piece of the turn before changes, one piece is added per
// turn, and the pieces' members (MembersOf) join to the request's members.
func TestNextPartsEqualsRequest(t *testing.T) {
	var chained, split int
	for _, g := range goldenBodies(t) {
		p, err := Decode(g.Body)
		if err != nil {
			t.Fatalf("line %d: %v", g.line, err)
		}
		answers := goldenAnswers(p)
		first, err := p.Request(0, nil, true)
		if err != nil {
			t.Fatalf("line %d turn 0: %v", g.line, err)
		}
		prev := [][]byte{first}
		for k := 1; k < p.NumTurns(); k++ {
			before := bytes.Join(prev, nil)
			got, err := p.NextParts(prev, k-1, answers[k-1], true)
			if err != nil {
				t.Fatalf("line %d turn %d: %v", g.line, k, err)
			}
			want, err := p.Request(k, answers[:k], true)
			if err != nil {
				t.Fatalf("line %d turn %d: %v", g.line, k, err)
			}
			if joined := bytes.Join(got, nil); !bytes.Equal(joined, want) {
				t.Errorf("line %d turn %d:\n got %s\nwant %s", g.line, k, joined, want)
			}
			if !bytes.Equal(bytes.Join(prev, nil), before) || len(got) != k+1 {
				t.Errorf("line %d turn %d: the turn before changed, or %d pieces (want %d)", g.line, k, len(got), k+1)
			}
			wantMembers, gotMembers := map[string]string{}, map[string]string{}
			for _, m := range p.Members(k, want) {
				wantMembers[m.Key] = string(m.Value)
			}
			for _, m := range p.MembersOf(k, got) {
				gotMembers[m.Key] = string(m.Bytes())
				if m.Pieces != nil {
					split++
				}
			}
			if diff := cmp.Diff(wantMembers, gotMembers); diff != "" {
				t.Errorf("line %d turn %d members (-Members +MembersOf):\n%s", g.line, k, diff)
			}
			prev = got
			chained++
		}
		if _, err := p.NextParts(prev, p.NumTurns()-1, answers[p.NumTurns()-1], true); err == nil {
			t.Errorf("line %d: a request after the last turn was built", g.line)
		}
	}
	if chained < 20 || split < 10 {
		t.Fatalf("%d turns chained, %d messages in pieces: the golden file has too few conversations", chained, split)
	}
}

// TestNextRequestRefuses: a turn the model's answer cannot lead to, and a
// request that is not the plan's, build nothing.
func TestNextRequestRefuses(t *testing.T) {
	p, err := Decode([]byte(glaiveBody))
	if err != nil {
		t.Fatal(err)
	}
	prev, err := p.Request(0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.NextRequest(prev, 0, llm.Result{Content: "no call"}, false); err == nil || !strings.Contains(err.Error(), "cannot follow") {
		t.Errorf("answer without the recorded call: err = %v, want cannot follow", err)
	}
	other, err := Decode([]byte(`{"messages":[{"role":"user","content":"hi"}],"turns":[{"input":[{"role":"user","content":"and?"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	otherReq, err := other.Request(0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.NextRequest(otherReq, 0, llm.Result{ToolCalls: p.Turns[0].Calls}, false); err == nil {
		t.Error("another plan's request was taken as this plan's")
	}
}

// TestMembersSplitTheRequest: Members are the request's top-level members
// with their bytes; a body with whitespace in its values (the client
// compacts what it walks) and a single turn sent as stored give none.
func TestMembersSplitTheRequest(t *testing.T) {
	var split int
	for _, g := range goldenBodies(t) {
		p, err := Decode(g.Body)
		if err != nil {
			t.Fatalf("line %d: %v", g.line, err)
		}
		answers := goldenAnswers(p)
		for k := range p.NumTurns() {
			body, err := p.Request(k, answers[:k], false)
			if err != nil {
				t.Fatal(err)
			}
			ms := p.Members(k, body)
			if k == 0 && len(p.Turns) == 0 && p.Original == nil {
				if ms != nil {
					t.Errorf("line %d: members of a body sent as stored", g.line)
				}
				continue
			}
			var want map[string]json.RawMessage
			if err := json.Unmarshal(body, &want); err != nil {
				t.Fatal(err)
			}
			got := map[string]json.RawMessage{}
			for _, m := range ms {
				got[m.Key] = m.Value
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("line %d turn %d members (-body +members):\n%s", g.line, k, diff)
			}
			split++
		}
	}
	if split < 20 {
		t.Fatalf("%d requests split", split)
	}
	spaced, err := Decode([]byte(`{"messages":[{"role":"user","content":"a"}],"tools":[ {"type":"function"} ],"turns":[{"input":[{"role":"user","content":"b"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := spaced.Request(0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if ms := spaced.Members(0, body); ms != nil {
		t.Errorf("members of a request with spaced values: %v", ms)
	}
}
