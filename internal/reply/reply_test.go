package reply

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/rawjson"
	"github.com/regen-dev/regen/internal/store"
)

// previous is one answer stored by the release before "v" (see
// testdata/README.md) and what that release's readers made of it.
type previous struct {
	Sample     string           `json:"sample"`
	Response   json.RawMessage  `json:"response"`
	Column     store.Result     `json:"column"`
	Dispatch   llm.Result       `json:"dispatch"`
	Export     llm.Result       `json:"export"`
	Provenance store.Provenance `json:"provenance"`
}

func readPrevious(t *testing.T) []previous {
	t.Helper()
	f, err := os.Open("testdata/c2f7b29.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []previous
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		var p previous
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("testdata/c2f7b29.jsonl:%d: %v", line, err)
		}
		p.Column.Response = p.Response
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Answers written by the previous release decode to what its readers made
// of them: dispatch's completion, export's completion and provenance.
func TestDecodePreviousRelease(t *testing.T) {
	prev := readPrevious(t)
	var turns [2]int
	var reasoning, tools int
	for _, p := range prev {
		rec, err := Decode(p.Column)
		if err != nil {
			t.Fatalf("%s turn %d: %v", p.Sample, p.Column.Turn, err)
		}
		if rec.V != 0 {
			t.Errorf("%s turn %d: version %d, want 0 (no \"v\" key)", p.Sample, p.Column.Turn, rec.V)
		}
		if diff := cmp.Diff(p.Dispatch, rec.Result); diff != "" {
			t.Errorf("%s turn %d: completion differs from the old dispatch reader (-old +new):\n%s", p.Sample, p.Column.Turn, diff)
		}
		if diff := cmp.Diff(p.Export, rec.Result); diff != "" {
			t.Errorf("%s turn %d: completion differs from the old export reader (-old +new):\n%s", p.Sample, p.Column.Turn, diff)
		}
		if diff := cmp.Diff(p.Provenance, rec.Provenance); diff != "" {
			t.Errorf("%s turn %d: provenance differs from the old export reader (-old +new):\n%s", p.Sample, p.Column.Turn, diff)
		}
		if rec.Endpoint == "" || rec.Endpoint != p.Column.Endpoint {
			t.Errorf("%s turn %d: endpoint %q, want the column's %q", p.Sample, p.Column.Turn, rec.Endpoint, p.Column.Endpoint)
		}
		turns[p.Column.Turn]++
		if rec.ReasoningContent != "" {
			reasoning++
		}
		if len(rec.ToolCalls) > 0 {
			tools++
		}
	}
	// The file covers what the shape carries; a regenerated file must too.
	if turns[0] == 0 || turns[1] == 0 || reasoning == 0 || tools == 0 {
		t.Fatalf("testdata covers turns %v, %d reasoning, %d tool-call answers: want every kind", turns, reasoning, tools)
	}
}

// A new record reads back to what was encoded, and a reader of the
// previous shape (which ignores unknown keys) reads it as it read the old.
func TestEncodeRoundTrip(t *testing.T) {
	for _, p := range readPrevious(t) {
		old, err := Decode(p.Column)
		if err != nil {
			t.Fatal(err)
		}
		col := p.Column
		col.Response = Encode(old.Result, old.Endpoint, old.Provenance)
		if !bytes.HasPrefix(col.Response, []byte(`{"v":1,`)) {
			t.Errorf("%s: encoded record starts %.20s, want the version first", p.Sample, col.Response)
		}
		got, err := Decode(col)
		if err != nil {
			t.Fatal(err)
		}
		want := old
		want.V = Version
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s turn %d: round trip (-want +got):\n%s", p.Sample, col.Turn, diff)
		}
		var asOld llm.Result
		if err := json.Unmarshal(col.Response, &asOld); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p.Dispatch, asOld); diff != "" {
			t.Errorf("%s turn %d: the previous reader reads a new record differently (-old +new):\n%s", p.Sample, col.Turn, diff)
		}
	}
}

// What an older record is silent about comes from the columns; a record of
// a later version or one that is not JSON is an error, not a blank answer.
func TestDecode(t *testing.T) {
	cols := store.Result{FinishReason: "length", PromptTokens: 10, CompletionTokens: 5, ReasoningTokens: 3,
		Endpoint: "http://127.0.0.1:1", Generation: 2}
	tests := []struct {
		name     string
		response string
		want     Record
		wantErr  string
	}{
		{name: "completion only", response: `{"content":"hi","model":"m"}`,
			want: Record{Result: llm.Result{Content: "hi", Model: "m", FinishReason: "length",
				Usage: llm.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15, ReasoningTokens: 3}},
				Endpoint: "http://127.0.0.1:1", Provenance: store.Provenance{Generation: 2, Model: "m"}}},
		{name: "the record wins where it speaks",
			response: `{"v":1,"content":"hi","finish_reason":"stop","usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8},` +
				`"endpoint":"http://127.0.0.1:2","provenance":{"generation":1,"model":"p"}}`,
			want: Record{V: 1, Result: llm.Result{Content: "hi", FinishReason: "stop",
				Usage: llm.Usage{PromptTokens: 7, CompletionTokens: 1, TotalTokens: 8}},
				Endpoint: "http://127.0.0.1:2", Provenance: store.Provenance{Generation: 1, Model: "p"}}},
		{name: "later version", response: `{"v":2,"content":"hi"}`, wantErr: "stored answer version 2: this regen reads versions up to 1"},
		{name: "not JSON", response: `{"content":`, wantErr: "unexpected end of JSON input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := cols
			r.Response = []byte(tt.response)
			got, err := Decode(r)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// DecodeHistory (and DecodeHistoryQuoted) read the content, reasoning and tool calls Decode reads,
// from every record the previous release wrote and from records of this
// one with escapes, invalid UTF-8, tool calls and token ids.
func TestDecodeHistory(t *testing.T) {
	var rs []store.Result
	for _, p := range readPrevious(t) {
		rs = append(rs, p.Column)
	}
	var call llm.ToolCall
	call.ID, call.Type, call.Function.Name, call.Function.Arguments = "c1", "function", "f", `{"a":"<b>"}`
	results := []llm.Result{
		{Content: "plain"},
		{Content: "line\nbreak \"quoted\" <b> & \u2028 é \U0001F600", ReasoningContent: "think\tfirst", FinishReason: "stop"},
		{Content: "bad \xff utf-8", ReasoningContent: "\xc3"},
		{ToolCalls: []llm.ToolCall{call}, FinishReason: "tool_calls"},
		{Content: "ids", PromptTokenIDs: []int32{1, 2, 3}, CompletionTokenIDs: []int32{4}},
	}
	for _, res := range results {
		rs = append(rs, store.Result{Response: Encode(res, "http://a", store.Provenance{Model: "m"})})
	}
	ours := len(rs) - len(results)
	for i, r := range rs {
		rec, err := Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeHistoryQuoted(r)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		// ContentJSON, when given, stands for the content, quoted as
		// AppendString quotes it; this release writes valid text so.
		if got.ContentJSON != nil {
			if want := rawjson.AppendString(nil, rec.Content); !bytes.Equal(got.ContentJSON, want) || got.Content != "" {
				t.Errorf("record %d %s: ContentJSON %s and Content %q, want %s and none", i, r.Response, got.ContentJSON, got.Content, want)
			}
			got.Content = rec.Content
		} else if i >= ours && utf8.ValidString(results[i-ours].Content) {
			t.Errorf("record %d %s: no ContentJSON for valid text this release wrote", i, r.Response)
		}
		plain, err := DecodeHistory(r)
		if err != nil || plain.ContentJSON != nil {
			t.Errorf("record %d: DecodeHistory gave ContentJSON %s, %v", i, plain.ContentJSON, err)
		}
		got.ContentJSON = nil
		want := llm.Result{Content: rec.Content, ReasoningContent: rec.ReasoningContent, ToolCalls: rec.ToolCalls}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("record %d %s (-Decode +DecodeHistory):\n%s", i, r.Response, diff)
		}
	}
	if _, err := DecodeHistory(store.Result{Response: []byte(`{"v":2,"content":"x"}`)}); err == nil {
		t.Error("a record of a later version: no error")
	}
	if _, err := DecodeHistory(store.Result{Response: []byte(`{"content":"x"`)}); err == nil {
		t.Error("a cut record: no error")
	}
}
