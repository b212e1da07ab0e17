package source

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// tools reads the mapped tools field: an array, or a string holding a JSON
// array or concatenated JSON objects (glaive style). Missing, null, "" and
// [] all mean no tools.
func (m *mapper) tools(row map[string]any) ([]any, *rowError) {
	field := m.src.Tools
	if field == "" {
		return nil, nil
	}
	var list []any
	switch v := row[field].(type) {
	case nil:
		return nil, nil
	case []any:
		list = v
	case string, []byte:
		s, _ := asString(v)
		var err error
		if list, err = parseToolsString(s); err != nil {
			return nil, fieldErr(field, "bad tools JSON: %v", err)
		}
	default:
		return nil, wrongType(field, "array or JSON string", v)
	}
	out := make([]any, 0, len(list))
	for i, e := range list {
		t, rerr := normalizeTool(e, fmt.Sprintf("%s[%d]", field, i))
		if rerr != nil {
			return nil, rerr
		}
		out = append(out, t)
	}
	return out, nil
}

func parseToolsString(s string) ([]any, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if s[0] == '[' {
		var list []any
		if err := dec.Decode(&list); err != nil {
			return nil, errors.New(malformed(err, int64(len(s))))
		}
		if dec.More() {
			return nil, fmt.Errorf("data after the array at byte %d", dec.InputOffset())
		}
		return list, nil
	}
	var list []any
	for {
		var v any
		err := dec.Decode(&v)
		if err == io.EOF {
			return list, nil
		}
		if err != nil {
			return nil, errors.New(malformed(err, int64(len(s))))
		}
		list = append(list, v)
	}
}

// normalizeTool returns an OpenAI tool object, wrapping a bare function schema.
func normalizeTool(e any, at string) (any, *rowError) {
	obj, ok := e.(map[string]any)
	if !ok {
		return nil, wrongType(at, "object", e)
	}
	plain(obj)
	if fn, ok := obj["function"].(map[string]any); ok {
		if name, _ := fn["name"].(string); name == "" {
			return nil, fieldErr(at+".function.name", "missing")
		}
		if _, ok := obj["type"]; !ok {
			obj["type"] = "function"
		}
		return obj, nil
	}
	if name, _ := obj["name"].(string); name != "" {
		return map[string]any{"type": "function", "function": obj}, nil
	}
	return nil, fieldErr(at, "want a tool object {type, function} or a function schema with name")
}
