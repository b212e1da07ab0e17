package source

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// turnPath names turn i of a list field (i < 0: the field itself); the
// string is built only when a row is bad, keeping good rows cheap.
type turnPath struct {
	field string
	i     int
	key   string
}

func (p turnPath) String() string {
	s := p.field
	if p.i >= 0 {
		s += "[" + strconv.Itoa(p.i) + "]"
	}
	if p.key != "" {
		s += "." + p.key
	}
	return s
}

// sub is the path of key inside turn p.
func (p turnPath) sub(key string) string { p.key = key; return p.String() }

// rowError is why one row cannot become a sample.
type rowError struct {
	field  string
	reason string
}

func (e *rowError) Error() string { return e.reason }

func fieldErr(field, format string, args ...any) *rowError {
	return &rowError{field: field, reason: "field " + field + ": " + fmt.Sprintf(format, args...)}
}

func wrongType(field, want string, got any) *rowError {
	return fieldErr(field, "want %s, got %s", want, jsonType(got))
}

// jsonType names a decoded value's JSON type for error messages.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string, []byte:
		return "string"
	case bool:
		return "boolean"
	case json.Number, float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// asString accepts string and []byte (Parquet BYTE_ARRAY without the STRING annotation).
func asString(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return s, true
	case []byte:
		return string(s), true
	}
	return "", false
}

// plain converts []byte leaves to strings so nested values marshal as text, not base64.
func plain(v any) any {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case []any:
		for i := range x {
			x[i] = plain(x[i])
		}
	case map[string]any:
		for k, e := range x {
			x[k] = plain(e)
		}
	}
	return v
}

// idValue formats the mapped id field: a non-empty string or a number.
func idValue(row map[string]any, field string) (string, *rowError) {
	v, ok := row[field]
	if !ok || v == nil {
		return "", fieldErr(field, "missing")
	}
	switch x := v.(type) {
	case string:
		if x == "" {
			return "", fieldErr(field, "empty id")
		}
		return x, nil
	case []byte:
		if len(x) == 0 {
			return "", fieldErr(field, "empty id")
		}
		return string(x), nil
	case json.Number:
		return x.String(), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case float32:
		return strconv.FormatFloat(float64(x), 'f', -1, 32), nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), nil
	}
	return "", wrongType(field, "string or number", v)
}

// turnObject is entry i of list field, which must be an object, and its path.
func turnObject(field string, i int, e any) (map[string]any, turnPath, *rowError) {
	at := turnPath{field: field, i: i}
	obj, ok := e.(map[string]any)
	if !ok {
		return nil, at, wrongType(at.String(), "object", e)
	}
	return obj, at, nil
}

func listField(row map[string]any, field string) ([]any, *rowError) {
	v, ok := row[field]
	if !ok || v == nil {
		return nil, fieldErr(field, "missing")
	}
	list, ok := v.([]any)
	if !ok {
		return nil, wrongType(field, "array", v)
	}
	return list, nil
}
