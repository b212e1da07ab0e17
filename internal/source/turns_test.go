package source

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/llm"
)

func TestTurnPlans(t *testing.T) {
	glaive := job.Source{Partition: "G", Conversations: "c", Tools: "tools", SystemField: "system", ID: "id", StripSystemPrefix: "SYSTEM:"}
	last := glaive
	last.Regenerate = job.RegenerateLast
	const tools = `"tools":"[{\"name\":\"f\",\"parameters\":{}},{\"name\":\"g\"}]"`
	tests := []struct {
		name     string
		src      job.Source
		row      string
		wantBody string
		wantBad  *rowError
	}{
		{"glaive system prefix stripped, call and observation become a linked round trip", glaive,
			`{"id":"1","system":"SYSTEM: You are helpful.",` + tools + `,"c":[{"from":"human","value":"do f"},` +
				`{"from":"function_call","value":"{\"name\": \"f\", \"arguments\": {\"x\": 1, \"y\": [2]}}"},` +
				`{"from":"observation","value":"{\"ok\": true}"},{"from":"gpt","value":"done"},{"from":"human","value":"again?"}]}`,
			`{"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"do f"}],` +
				`"tools":[{"function":{"name":"f","parameters":{}},"type":"function"},{"function":{"name":"g"},"type":"function"}],` +
				`"turns":[{"calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\":1,\"y\":[2]}"}}],` +
				`"input":[{"role":"tool","content":"{\"ok\": true}","tool_call_id":"call_1"}]},` +
				`{"input":[{"role":"user","content":"again?"}]}]}`, nil},
		{"own system message stripped too; string arguments kept as written", glaive,
			`{"id":"1","c":[{"from":"system","value":"SYSTEM:  Be terse."},{"from":"human","value":"q"},` +
				`{"from":"function_call","value":"{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}"},{"from":"observation","value":"r"}]}`,
			`{"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"q"}],` +
				`"turns":[{"calls":[{"id":"call_2","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}],"input":[{"role":"tool","content":"r","tool_call_id":"call_2"}]}]}`, nil},
		{"text then two parallel calls are one answer; results link in order", glaive,
			`{"id":"1","c":[{"from":"human","value":"q"},{"from":"gpt","value":"Let me check."},` +
				`{"from":"function_call","value":"{\"name\":\"f\",\"arguments\":{}}"},{"from":"function_call","value":"{\"name\":\"g\"}"},` +
				`{"from":"observation","value":"rf"},{"from":"observation","value":"rg"},{"from":"gpt","value":"both done"}]}`,
			`{"messages":[{"role":"user","content":"q"}],"turns":[{"calls":[` +
				`{"id":"call_2","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"call_3","type":"function","function":{"name":"g","arguments":"{}"}}],` +
				`"input":[{"role":"tool","content":"rf","tool_call_id":"call_2"},{"role":"tool","content":"rg","tool_call_id":"call_3"}]}]}`, nil},
		{"last turn only keeps the structured history", last,
			`{"id":"1","c":[{"from":"human","value":"q"},{"from":"gpt","value":"Let me check."},` +
				`{"from":"function_call","value":"{\"name\":\"f\",\"arguments\":{}}"},{"from":"observation","value":"rf"},{"from":"gpt","value":"done"}]}`,
			`{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_2","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"rf","tool_call_id":"call_2"}]}`, nil},
		{"three plain turns", glaive,
			`{"id":"1","c":[{"from":"human","value":"a"},{"from":"gpt","value":"A"},{"from":"human","value":"b"},{"from":"gpt","value":"B"},{"from":"human","value":"c"},{"from":"gpt","value":"C"}]}`,
			`{"messages":[{"role":"user","content":"a"}],"turns":[{"input":[{"role":"user","content":"b"}]},{"input":[{"role":"user","content":"c"}]}]}`, nil},
		{"observation with no call before it", glaive,
			`{"id":"1","c":[{"from":"human","value":"q"},{"from":"gpt","value":"hm"},{"from":"observation","value":"r"}]}`, "",
			&rowError{"c[2].value", "field c[2].value: tool result with no tool call before it to answer"}},
		{"more results than calls", glaive,
			`{"id":"1","c":[{"from":"human","value":"q"},{"from":"function_call","value":"{\"name\":\"f\"}"},{"from":"observation","value":"r"},{"from":"observation","value":"r2"}]}`, "",
			&rowError{"c[3].value", "field c[3].value: tool result with no tool call before it to answer"}},
		{"function_call that is not JSON", glaive,
			`{"id":"1","c":[{"from":"human","value":"q"},{"from":"function_call","value":"f(x=1)"}]}`, "",
			&rowError{"c[1].value", "field c[1].value: function_call is not JSON {name, arguments}: invalid character '(' in literal false (expecting 'a')"}},
		{"function_call without a name", glaive,
			`{"id":"1","c":[{"from":"human","value":"q"},{"from":"function_call","value":"{\"arguments\":{}}"}]}`, "",
			&rowError{"c[1].value", "field c[1].value: function_call has no name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, rerr := newMapper(tt.src).sample(decodeRow(t, tt.row), "o")
			if diff := cmp.Diff(tt.wantBad, rerr, cmp.AllowUnexported(rowError{})); diff != "" {
				t.Fatalf("row error mismatch (-want +got):\n%s", diff)
			}
			if rerr != nil {
				return
			}
			if requestPart(s.Body) != tt.wantBody {
				t.Errorf("body\n got %s\nwant %s", s.Body, tt.wantBody)
			}
			if _, err := conversation.Decode(s.Body); err != nil {
				t.Errorf("the body does not decode as a plan: %v", err)
			}
		})
	}
}

// TestPlanRoundTrip feeds a mapped glaive row's plan answers that match the
// recorded call and checks the requests the dispatcher would send.
func TestPlanRoundTrip(t *testing.T) {
	src := job.Source{Partition: "G", Conversations: "c", Tools: "tools", ID: "id"}
	row := `{"id":"1","tools":[{"name":"f"}],"c":[{"from":"human","value":"do f"},{"from":"function_call","value":"{\"name\":\"f\",\"arguments\":{\"x\":1}}"},` +
		`{"from":"observation","value":"42"},{"from":"gpt","value":"It is 42."},{"from":"human","value":"thanks"}]}`
	s, rerr := newMapper(src).sample(decodeRow(t, row), "o")
	if rerr != nil {
		t.Fatal(rerr)
	}
	p, err := conversation.Decode(s.Body)
	if err != nil {
		t.Fatal(err)
	}
	if p.NumTurns() != 3 {
		t.Fatalf("NumTurns = %d, want 3", p.NumTurns())
	}
	var call llm.ToolCall
	call.ID, call.Type = "srv-7", "function"
	call.Function.Name, call.Function.Arguments = "f", `{ "x" : 1 }`
	answers := []llm.Result{{ToolCalls: []llm.ToolCall{call}}, {Content: "42 it is."}, {Content: "You're welcome."}}
	req, err := p.Request(2, answers[:2], false)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Messages []struct {
			Role       string `json:"role"`
			ToolCallID string `json:"tool_call_id"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(req, &body); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range body.Messages {
		roles = append(roles, m.Role+":"+m.ToolCallID)
	}
	want := []string{"user:", "assistant:", "tool:srv-7", "assistant:", "user:"}
	if diff := cmp.Diff(want, roles); diff != "" {
		t.Errorf("turn 2 request roles (-want +got):\n%s", diff)
	}
}

// requestPart is a body without the dataset's answers, which sample()
// appends last ("original", checked by TestOriginals).
func requestPart(body []byte) string {
	if head, _, ok := bytes.Cut(body, []byte(`,"original":`)); ok {
		return string(head) + "}"
	}
	return string(body)
}

// TestOriginals: the dataset's own answer to each regenerated turn is kept
// in the body (one list of assistant messages per turn, tool calls
// structured), the sample id is the one the body without them gives, and
// the request sent never carries them.
func TestOriginals(t *testing.T) {
	every := job.Source{Partition: "G", Conversations: "c"}
	last := every
	last.Regenerate = job.RegenerateLast
	glaive := job.Source{Partition: "G", Conversations: "c", Tools: "tools"}
	tests := []struct {
		name string
		src  job.Source
		row  string
		want string // the "original" value; "" for none
	}{
		{"three turns", every,
			`{"c":[{"from":"human","value":"a"},{"from":"gpt","value":"A"},{"from":"human","value":"b"},{"from":"gpt","value":"B"},{"from":"human","value":"c"},{"from":"gpt","value":"C"}]}`,
			`[[{"role":"assistant","content":"A"}],[{"role":"assistant","content":"B"}],[{"role":"assistant","content":"C"}]]`},
		{"a call, its result, the answer", glaive,
			`{"tools":"[{\"name\":\"f\"}]","c":[{"from":"human","value":"q"},{"from":"gpt","value":"Let me check."},` +
				`{"from":"function_call","value":"{\"name\":\"f\",\"arguments\":{}}"},{"from":"observation","value":"rf"},{"from":"gpt","value":"done"}]}`,
			`[[{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_2","type":"function","function":{"name":"f","arguments":"{}"}}]}],[{"role":"assistant","content":"done"}]]`},
		{"last turn only", last,
			`{"c":[{"from":"human","value":"a"},{"from":"gpt","value":"A"},{"from":"human","value":"b"},{"from":"gpt","value":"B"}]}`,
			`[[{"role":"assistant","content":"B"}]]`},
		{"no answer in the row", every, `{"c":[{"from":"human","value":"a"}]}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, rerr := newMapper(tt.src).sample(decodeRow(t, tt.row), "o")
			if rerr != nil {
				t.Fatal(rerr)
			}
			var body struct {
				Original json.RawMessage `json:"original"`
			}
			if err := json.Unmarshal(s.Body, &body); err != nil {
				t.Fatal(err)
			}
			if string(body.Original) != tt.want {
				t.Errorf("original\n got %s\nwant %s", body.Original, tt.want)
			}
			h := sha256.New()
			io.WriteString(h, tt.src.Partition)
			h.Write([]byte{0})
			io.WriteString(h, requestPart(s.Body))
			if want := tt.src.Partition + "/" + hex.EncodeToString(h.Sum(nil))[:32]; s.ID != want {
				t.Errorf("id %s, want %s (the hash of the body without the dataset's answers)", s.ID, want)
			}
			p, err := conversation.Decode(s.Body)
			if err != nil {
				t.Fatal(err)
			}
			req, err := p.Request(0, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(req, []byte("original")) || !bytes.Contains(req, []byte(`"messages"`)) {
				t.Errorf("turn 0's request carries the dataset's answers or no messages: %s", req)
			}
		})
	}
}
