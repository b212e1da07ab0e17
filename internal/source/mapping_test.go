package source

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/job"
)

func decodeRow(t *testing.T, s string) map[string]any {
	t.Helper()
	var d decoder
	row, reason := d.object([]byte(s))
	if reason != "" {
		t.Fatalf("decode %s: %s", s, reason)
	}
	return row
}

func TestMapping(t *testing.T) {
	sg := job.Source{Partition: "S", Conversations: "c", Tools: "tools", SystemField: "sys", ID: "id"}
	oa := job.Source{Partition: "O", Messages: "m", ID: "id"}
	pr := job.Source{Partition: "P", Prompt: "p", ID: "id", System: "literal"}
	tests := []struct {
		name     string
		src      job.Source
		row      string
		wantBody string
		wantID   string
		wantBad  *rowError
	}{
		{"glaive tools as concatenated objects", sg,
			`{"id":"a","tools":"{\"name\":\"f\"}\n\n{\"name\":\"g\",\"parameters\":{\"n\":1.50}}","c":[{"from":"human","value":"x"}]}`,
			`{"messages":[{"role":"user","content":"x"}],"tools":[{"function":{"name":"f"},"type":"function"},{"function":{"name":"g","parameters":{"n":1.50}},"type":"function"}]}`, "S/a", nil},
		{"tools [] means none", sg,
			`{"id":"a","tools":"[]","c":[{"from":"human","value":"x"}]}`, `{"messages":[{"role":"user","content":"x"}]}`, "S/a", nil},
		{"tool object missing type gets it", sg,
			`{"id":"a","tools":[{"function":{"name":"f"}}],"c":[{"from":"human","value":"x"}]}`,
			`{"messages":[{"role":"user","content":"x"}],"tools":[{"function":{"name":"f"},"type":"function"}]}`, "S/a", nil},
		{"sharegpt with role/content keys and system field", sg,
			`{"id":"a","sys":"be nice","c":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]}`,
			`{"messages":[{"role":"system","content":"be nice"},{"role":"user","content":"x"}]}`, "S/a", nil},
		{"ShareGPT roles are case-insensitive", sg,
			`{"id":"a","c":[{"from":"Human","value":"x"}]}`, `{"messages":[{"role":"user","content":"x"}]}`, "S/a", nil},
		{"integer id stays exact", sg,
			`{"id":12345678901234567890,"c":[{"from":"human","value":"x"}]}`, `{"messages":[{"role":"user","content":"x"}]}`, "S/12345678901234567890", nil},
		{"system field wrong type", sg,
			`{"id":"a","sys":3,"c":[{"from":"human","value":"x"}]}`, "", "", &rowError{"sys", "field sys: want string, got number"}},
		{"tools wrong type", sg,
			`{"id":"a","tools":{"name":"f"},"c":[{"from":"human","value":"x"}]}`, "", "", &rowError{"tools", "field tools: want array or JSON string, got object"}},
		{"turn not an object", sg,
			`{"id":"a","c":["hi"]}`, "", "", &rowError{"c[0]", "field c[0]: want object, got string"}},
		{"id wrong type", sg,
			`{"id":true,"c":[{"from":"human","value":"x"}]}`, "", "", &rowError{"id", "field id: want string or number, got boolean"}},
		{"openai unknown role", oa,
			`{"id":1,"m":[{"role":"robot","content":"x"}]}`, "", "", &rowError{"m[0].role", `field m[0].role: unknown role "robot"`}},
		{"openai content wrong type", oa,
			`{"id":1,"m":[{"role":"user","content":5}]}`, "", "", &rowError{"m[0].content", "field m[0].content: want string, array or null, got number"}},
		{"openai null content without tool calls", oa,
			`{"id":1,"m":[{"role":"user","content":null}]}`, "", "", &rowError{"m[0].content", "field m[0].content: empty content"}},
		{"openai tool_calls wrong type", oa,
			`{"id":1,"m":[{"role":"user","content":"x","tool_calls":"f()"}]}`, "", "", &rowError{"m[0].tool_calls", "field m[0].tool_calls: want array, got string"}},
		{"only a system message", oa,
			`{"id":1,"m":[{"role":"system","content":"x"}]}`, "", "", &rowError{"m", "field m: empty conversation"}},
		{"prompt with literal system", pr,
			`{"id":"z","p":"q"}`, `{"messages":[{"role":"system","content":"literal"},{"role":"user","content":"q"}]}`, "P/z", nil},
		{"prompt empty", pr, `{"id":"z","p":""}`, "", "", &rowError{"p", "field p: empty content"}},
		{"prompt wrong type", pr, `{"id":"z","p":["q"]}`, "", "", &rowError{"p", "field p: want string, got array"}},
		{"prompt missing", pr, `{"id":"z"}`, "", "", &rowError{"p", "field p: missing"}},
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
			if requestPart(s.Body) != tt.wantBody || s.ID != tt.wantID {
				t.Errorf("got id %s body %s\nwant id %s body %s", s.ID, s.Body, tt.wantID, tt.wantBody)
			}
			if !json.Valid(s.Body) {
				t.Errorf("body is not valid JSON: %s", s.Body)
			}
		})
	}
}

// The same content must give the same bytes whatever the key order of the input.
func TestCanonicalBody(t *testing.T) {
	src := job.Source{Partition: "O", Messages: "m", Tools: "t"}
	a := `{"m":[{"role":"user","content":"x","name":"n"}],"t":[{"type":"function","function":{"parameters":{"b":1,"a":2},"name":"f"}}]}`
	b := `{"t":[{"function":{"name":"f","parameters":{"a":2,"b":1}},"type":"function"}],"m":[{"name":"n","content":"x","role":"user"}]}`
	sa, ea := newMapper(src).sample(decodeRow(t, a), "a")
	sb, eb := newMapper(src).sample(decodeRow(t, b), "b")
	if ea != nil || eb != nil {
		t.Fatalf("row errors: %v, %v", ea, eb)
	}
	if !bytes.Equal(sa.Body, sb.Body) || sa.ID != sb.ID {
		t.Errorf("bodies differ:\n%s %s\n%s %s", sa.ID, sa.Body, sb.ID, sb.Body)
	}
}
