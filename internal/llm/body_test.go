package llm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// encodingJSONBody is the request body as encoding/json builds it: Body
// decoded into a map of raw values, the client's keys added, the map
// encoded without HTML escaping. buildBody must write the same bytes
// without decoding Body.
func encodingJSONBody(t *testing.T, req Request, tokenIDs []string) []byte {
	t.Helper()
	obj := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(req.Body)) > 0 {
		if err := json.Unmarshal(req.Body, &obj); err != nil {
			t.Fatalf("reference decode of %s: %v", req.Body, err)
		}
	}
	for k, v := range req.Params {
		obj[k] = v
	}
	if req.Model != "" {
		obj["model"], _ = json.Marshal(req.Model)
	}
	if req.MaxTokens > 0 {
		obj["max_tokens"] = json.RawMessage(fmt.Sprint(req.MaxTokens))
	}
	for _, f := range append(tokenIDs, req.TokenIDFields...) {
		obj[f] = json.RawMessage("true")
	}
	obj["stream"] = json.RawMessage("true")
	obj["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// TestBuildBodyBytes: for every body the sources write (source's golden
// bodies) and for bodies with whitespace, escaped and odd keys, duplicate
// keys and params that override them, buildBody writes the bytes
// encoding/json writes.
func TestBuildBodyBytes(t *testing.T) {
	bodies := []string{
		``,
		`{}`,
		` { "messages" : [ {"role": "user", "content": "a <b> & c\u2028"} ] , "tools":[ ] } `,
		`{"messages":[{"role":"user","content":"x"}],"temperature":0.1,"temperature":0.7}`,
		`{"m\u00e9ssages":[],"a\"b":1,"tab\there":2,"é":3,"\u2028":4,"<k>":{"x" :[1, 2]}}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"seed":3,"max_tokens":9,"stream":false}`,
	}
	f, err := os.Open("../source/testdata/bodies.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var g struct {
			Body json.RawMessage `json:"body"`
		}
		if json.Unmarshal(sc.Bytes(), &g) == nil && g.Body != nil {
			bodies = append(bodies, string(g.Body))
		}
	}
	if len(bodies) < 30 {
		t.Fatalf("%d bodies: the golden file did not load", len(bodies))
	}
	params := map[string]json.RawMessage{"temperature": json.RawMessage(` 0.5`), "chat_template_kwargs": json.RawMessage(`{"enable_thinking": false}`)}
	reqs := []struct {
		model    string
		max      int
		params   map[string]json.RawMessage
		tokenIDs []string
	}{
		{"m", 100, nil, nil},
		{"org/<model>&x", 0, params, []string{"return_token_ids"}},
	}
	for i, body := range bodies {
		for _, r := range reqs {
			req := Request{Model: r.model, Body: json.RawMessage(body), MaxTokens: r.max, Params: r.params, TokenIDFields: []string{"return_output_ids_in_sglext"}}
			got, err := buildBody(req, r.tokenIDs)
			if err != nil {
				t.Fatalf("body %d %s: %v", i, body, err)
			}
			if want := encodingJSONBody(t, req, r.tokenIDs); !bytes.Equal(got, want) {
				t.Errorf("body %d:\n got %s\nwant %s", i, got, want)
			}
		}
	}
}

// TestBuildBodyFromMembers: a body handed over as its members (split by
// whoever built it, compact) gives the bytes the walk of the body gives,
// params still winning over its keys; Body is not read then.
func TestBuildBodyFromMembers(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"a <b> & c\u2028 é"}],"tools":[{"type":"function"}],"seed":3,"temperature":0.1}`
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &top); err != nil {
		t.Fatal(err)
	}
	var members []Member
	for _, k := range []string{"messages", "tools", "seed", "temperature"} {
		members = append(members, Member{Key: k, Value: top[k]})
	}
	params := map[string]json.RawMessage{"temperature": json.RawMessage(`0.5`)}
	walked, err := buildBody(Request{Model: "m", Body: json.RawMessage(body), MaxTokens: 9, Params: params}, []string{"return_token_ids"})
	if err != nil {
		t.Fatal(err)
	}
	split, err := buildBody(Request{Model: "m", Body: json.RawMessage(`not read`), Members: members, MaxTokens: 9, Params: params}, []string{"return_token_ids"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(split, walked) {
		t.Errorf("from members:\n%s\nfrom the body:\n%s", split, walked)
	}
	if !bytes.Contains(split, []byte(`"temperature":0.5`)) {
		t.Errorf("params lost to the body's key: %s", split)
	}
}

func TestBuildBodyRefusesBrokenJSON(t *testing.T) {
	for _, body := range []string{`[1]`, `{"messages":[}`, `{"a":"\x"}`, `{"a":1} {}`, `"s"`} {
		_, err := buildBody(Request{Body: json.RawMessage(body)}, nil)
		if e, ok := err.(*Error); !ok || e.Class != BadRequest {
			t.Errorf("body %s: error %v, want a BadRequest *Error", body, err)
		}
	}
	_, err := buildBody(Request{Body: json.RawMessage(`{}`), Params: map[string]json.RawMessage{"t": json.RawMessage(`0.`)}}, nil)
	if e, ok := err.(*Error); !ok || e.Class != BadRequest {
		t.Errorf("bad param: error %v, want a BadRequest *Error", err)
	}
}
