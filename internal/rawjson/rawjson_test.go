package rawjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// isObject is what Object must accept: what encoding/json decodes into a
// map.
func isObject(b []byte) bool {
	var m map[string]json.RawMessage
	return json.Valid(b) && json.Unmarshal(b, &m) == nil && bytes.TrimSpace(b)[0] == '{'
}

var texts = []string{
	`{}`, ` { } `, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{"a":}`, `{a:1}`, `{"a":1}x`, `{"a":1} `, `[1]`, `"s"`, ``, `{`,
	`{"a":[1,2,{"b":null,"c":[true,false]}],"d":"e"}`, `{"a":[1,,2]}`, `{"a":[1 2]}`, `{"a":{"b"}}`, `{"a":{"b":1,}}`,
	`{"a":"\u00e9\n\t\"\\\/"}`, `{"a":"\x"}`, `{"a":"\u12"}`, `{"a":"\u12G4"}`, "{\"a\":\"tab\there\"}", `{"a":"unterminated}`,
	`{"a":-0.5e+10}`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":1E-2}`, `{"a":tru}`, `{"a":nul}`,
	`{"a":truex}`, `{"\u0061":1}`, `{"a":1,"a":2}`, "{\"a\":\"\xff\xfe\"}", `{"a" : [ 1 , 2 ] , "b" : { "c" : 3 } }`,
}

func TestObjectAcceptsWhatEncodingJSONDoes(t *testing.T) {
	for _, s := range texts {
		err := Object([]byte(s), func(Member) error { return nil })
		if want := isObject([]byte(s)); (err == nil) != want {
			t.Errorf("Object(%q) error %v, want valid=%v", s, err, want)
		}
	}
}

// Random corruptions of valid bodies: every one is judged as
// encoding/json judges it.
func TestObjectMutations(t *testing.T) {
	seeds := []string{
		`{"messages":[{"role":"system","content":"You \"are\" helpful.\n"},{"role":"user","content":[{"type":"text","text":"é <b>"}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"x":-1.5e3}}}],"seed":42}`,
		`{"a":[true,false,null,0,-0,1.25,"\u00e9"],"b":{"c":{"d":[]}}}`,
	}
	alphabet := []byte("{}[]\":,\\ \tu0123456789.eE+-truefalsn\x01ab")
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		b := []byte(seeds[i%len(seeds)])
		for range 1 + r.IntN(3) {
			switch p := r.IntN(len(b)); r.IntN(3) {
			case 0:
				b[p] = alphabet[r.IntN(len(alphabet))]
			case 1:
				b = append(b[:p], b[p+1:]...)
			default:
				b = append(b[:p], append([]byte{alphabet[r.IntN(len(alphabet))]}, b[p:]...)...)
			}
		}
		err := Object(b, func(Member) error { return nil })
		if want := isObject(b); (err == nil) != want {
			t.Fatalf("Object(%q) error %v, want valid=%v", b, err, want)
		}
	}
}

func TestObjectMembers(t *testing.T) {
	var got []Member
	err := Object([]byte(` {"a" : [ 1 , 2 ],"b\u0063":"x y","d":{"e":1}} `), func(m Member) error {
		got = append(got, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{
		{Key: "a", Value: []byte(`[ 1 , 2 ]`), Spaced: true},
		{Key: "bc", Value: []byte(`"x y"`)},
		{Key: "d", Value: []byte(`{"e":1}`)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
}

func TestStopAndErrors(t *testing.T) {
	var keys []string
	err := Object([]byte(`{"a":1,"b":2,"c":[`), func(m Member) error {
		keys = append(keys, m.Key)
		if m.Key == "b" {
			return ErrStop
		}
		return nil
	})
	if err != nil || !cmp.Equal(keys, []string{"a", "b"}) {
		t.Errorf("stopped walk: keys %v, err %v; want [a b] and no error (the rest is not read)", keys, err)
	}
	boom := errors.New("boom")
	if err := Object([]byte(`{"a":1}`), func(Member) error { return boom }); err != boom {
		t.Errorf("callback error: got %v, want it returned", err)
	}
	var elems []string
	err = Array([]byte(`[ {"role":"system"} , "x", 3 ]`), func(e []byte) error {
		elems = append(elems, string(e))
		return nil
	})
	if err != nil || !cmp.Equal(elems, []string{`{"role":"system"}`, `"x"`, `3`}) {
		t.Errorf("Array: %q, %v", elems, err)
	}
	if err := Array([]byte(`[1,]`), func([]byte) error { return nil }); err == nil {
		t.Error("Array([1,]): no error")
	}
}

func BenchmarkObject(b *testing.B) {
	text := bytes.Repeat([]byte("a long history of words, \"quoted\" and\nsplit "), 1500)
	body, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": string(text)}}})
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := Object(body, func(Member) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

func TestString(t *testing.T) {
	for _, v := range []string{`""`, `"plain"`, `"é\u00e9"`, `"a\nb\"c\\d\/e"`, `"\ud83d\ude00"`, `"\ud83d x"`, "\"\xff\xfe\"", "\"\xc3\""} {
		var want string
		if err := json.Unmarshal([]byte(v), &want); err != nil {
			t.Fatal(err)
		}
		got, err := String([]byte(v))
		if err != nil || got != want {
			t.Errorf("String(%s) = %q, %v; want %q", v, got, err, want)
		}
	}
	for _, v := range []string{`1`, `"`, `"abc`, `null`} {
		if _, err := String([]byte(v)); err == nil {
			t.Errorf("String(%s): no error", v)
		}
	}
}

// Random strings, escaped as encoding/json escapes them and with escapes
// it never writes (lone and reversed surrogates, \/, upper-case hex),
// decode as encoding/json decodes them.
func TestStringMatchesEncodingJSON(t *testing.T) {
	pieces := []string{"a", "é", "\n", "\"", "\\", "\xff", "\xc3", "\u2028", "😀", `\ud83d`, `\ude00`, `\u00E9`, `\/`, `\b`, `\f`, `\t`, `\u0000`, " "}
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		var raw []byte
		for range r.IntN(12) {
			raw = append(raw, pieces[r.IntN(len(pieces))]...)
		}
		enc, _ := json.Marshal(string(raw))
		// And raw as the inside of a string, where it is valid JSON.
		for _, v := range [][]byte{enc, append(append([]byte{'"'}, raw...), '"')} {
			var want string
			if json.Unmarshal(v, &want) != nil {
				if _, err := String(v); err == nil {
					t.Fatalf("String(%q): no error where encoding/json refuses it", v)
				}
				continue
			}
			got, err := String(v)
			if err != nil || got != want {
				t.Fatalf("String(%q) = %q, %v; want %q", v, got, err, want)
			}
		}
	}
}

// AppendString writes what encoding/json writes with HTML escaping off.
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	pieces := []string{"a", "abcdefghij", "é", "\n", "\r\t\b\f", "\"", "\\", "\xff", "\xc3", "\u2028", "\u2029", "😀", "<>&", "\x00", "\x1f", "\x7f", " ", "\ufffd"}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		var s []byte
		for range r.IntN(14) {
			s = append(s, pieces[r.IntN(len(pieces))]...)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(string(s)); err != nil {
			t.Fatal(err)
		}
		want := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if got := AppendString([]byte("x"), string(s)); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("AppendString(%q) = %s, want %s", s, got, want)
		}
	}
}

// The checked walks give what the checking ones give on checked text, and
// on text that was not checked they return, whatever they return, without
// a panic.
func TestCheckedWalks(t *testing.T) {
	var walk func(b []byte, checked bool) []string
	walk = func(b []byte, checked bool) []string {
		var out []string
		obj, arr := Object, Array
		if checked {
			obj, arr = CheckedObject, CheckedArray
		}
		err := obj(b, func(m Member) error {
			out = append(out, "key:"+m.Key+"="+string(m.Value))
			if text, err := m.Text(); err == nil {
				out = append(out, "text:"+text)
			}
			_ = arr(m.Value, func(e []byte) error {
				out = append(out, "elem:"+string(e))
				out = append(out, walk(e, checked)...)
				return nil
			})
			return nil
		})
		if err != nil {
			out = append(out, "error")
		}
		return out
	}
	seed := []byte(`{"messages":[{"role":"us\"er\\","content":"a\\\"b\n\u00e9\ud83d\ude00"},{"role":"x","content":[1,{"k":"\\\\"}]}],"tools":null,"s":"\\"}`)
	if diff := cmp.Diff(walk(seed, false), walk(seed, true)); diff != "" {
		t.Errorf("checked walk differs on checked text (-checking +checked):\n%s", diff)
	}
	r := rand.New(rand.NewPCG(7, 8))
	alphabet := []byte("{}[]\":,\\u0 x")
	for range 20000 {
		b := slices.Clone(seed)
		for range 1 + r.IntN(4) {
			p := r.IntN(len(b))
			if r.IntN(2) == 0 {
				b[p] = alphabet[r.IntN(len(alphabet))]
			} else {
				b = append(b[:p], b[p+1:]...)
			}
		}
		walk(b, true) // must not panic
	}
}

// Nesting is limited where encoding/json limits it (jsontext counts the
// same 10,000 levels).
func TestDepthLimitMatchesEncodingJSON(t *testing.T) {
	for _, depth := range []int{9998, 9999, 10000, 10001} {
		b := []byte(`{"a":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
		err := Object(b, func(Member) error { return nil })
		if want := isObject(b); (err == nil) != want {
			t.Errorf("depth %d: Object error %v, want valid=%v", depth, err, want)
		}
	}
}

// Spaced says whether encoding/json's Compact would change a value, on
// values with whitespace put at random between (and inside) their tokens.
func TestSpacedMatchesCompact(t *testing.T) {
	seed := `{"v":{"a":[1,2,{"b":null,"c":[true,"x, y: z"]}],"d":{"e":-1.5}}}`
	r := rand.New(rand.NewPCG(9, 10))
	for range 5000 {
		b := []byte(seed)
		for range r.IntN(3) {
			p := 5 + r.IntN(len(b)-6)
			b = append(b[:p], append([]byte{" \t\n\r"[r.IntN(4)]}, b[p:]...)...)
		}
		if !json.Valid(b) {
			continue
		}
		var got Member
		if err := Object(b, func(m Member) error { got = m; return nil }); err != nil {
			t.Fatalf("Object(%q): %v", b, err)
		}
		var c bytes.Buffer
		if err := json.Compact(&c, got.Value); err != nil {
			t.Fatal(err)
		}
		if want := c.Len() != len(got.Value); got.Spaced != want {
			t.Fatalf("Object(%q): value %q Spaced=%v, want %v", b, got.Value, got.Spaced, want)
		}
	}
}

// The checked walks split valid text as the checking ones do, members'
// Spaced included, whatever whitespace lies between and inside values.
func TestCheckedWalksMatchOnSpacedText(t *testing.T) {
	seed := `{"v":{"a":[1,2,{"b":null,"c":[true,"x, y: z \" ] }"]}],"d":{"e":-1.5}},"k\\u00e9\"":"\\\\","w":[ ],"o":{}}`
	r := rand.New(rand.NewPCG(11, 12))
	split := func(b []byte, obj func([]byte, func(Member) error) error, arr func([]byte, func([]byte) error) error) []any {
		var out []any
		err := obj(b, func(m Member) error {
			out = append(out, m)
			_ = obj(m.Value, func(n Member) error { out = append(out, n); return nil })
			_ = arr(m.Value, func(e []byte) error { out = append(out, string(e)); return nil })
			return nil
		})
		return append(out, err == nil)
	}
	for range 5000 {
		b := []byte(seed)
		for range r.IntN(4) {
			p := 1 + r.IntN(len(b)-2)
			b = append(b[:p], append([]byte{" \t\n\r"[r.IntN(4)]}, b[p:]...)...)
		}
		if !json.Valid(b) {
			continue
		}
		if diff := cmp.Diff(split(b, Object, Array), split(b, CheckedObject, CheckedArray)); diff != "" {
			t.Fatalf("%q (-checking +checked):\n%s", b, diff)
		}
	}
}

// AppendQuoted writes what AppendString writes for a string's text, or
// reports it cannot: it can for every string AppendString or encoding/json
// (HTML escapes on) writes of valid UTF-8, and never writes anything else
// (an invalid byte's \ufffd reads back as U+FFFD, which AppendString
// writes as itself; \/, \u0041, upper-case hex, \u00e9, a raw U+2028).
func TestAppendQuotedIsAppendString(t *testing.T) {
	check := func(q []byte) bool {
		t.Helper()
		text, err := Member{Value: q}.Text()
		if err != nil {
			t.Fatalf("Text(%s): %v", q, err)
		}
		got, ok := AppendQuoted([]byte("x"), q)
		if want := AppendString([]byte("x"), text); ok && !bytes.Equal(got, want) {
			t.Fatalf("AppendQuoted(%s) = %s, want %s", q, got, want)
		}
		if !ok && string(got) != "x" {
			t.Fatalf("AppendQuoted(%s) refused but wrote %s", q, got)
		}
		return ok
	}
	pieces := []string{"a", "é", "\n", "\r\t\b\f", "\"", "\\", "\xff", "\xc3", "\u2028", "\u2029", "😀", "<>&", "\x00", "\x1f", "\x7f", "/", "\ufffd"}
	r := rand.New(rand.NewPCG(7, 8))
	valid := 0
	for range 20000 {
		var s []byte
		for range r.IntN(14) {
			s = append(s, pieces[r.IntN(len(pieces))]...)
		}
		html, err := json.Marshal(string(s))
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range [][]byte{AppendString(nil, string(s)), html} {
			if !check(q) && utf8.Valid(s) {
				t.Fatalf("AppendQuoted(%s) refused the quoting of valid %q", q, s)
			}
		}
		if utf8.Valid(s) {
			valid++
		}
	}
	if valid < 1000 {
		t.Fatalf("only %d valid strings generated", valid)
	}
	escapes := []string{`\"`, `\\`, `\/`, `\b`, `\u0008`, `\n`, `\u000a`, `\u0000`, `\u001F`, `\u001f`, `\u0041`, `\u00e9`, `\u003c`, `\u003C`, `\u0026`, `\u2028`, `\u2029`, `\ud83d\ude00`, "\u2028", "é", "a", "<", "\xff", `\ufffd`}
	refused := 0
	for range 20000 {
		q := []byte{'"'}
		for range r.IntN(6) {
			q = append(q, escapes[r.IntN(len(escapes))]...)
		}
		if !check(append(q, '"')) {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no escape refused")
	}
}

// The checked walks refuse text after the value, as Object and Array do:
// a stored body with a second object or garbage after it is not split.
func TestCheckedWalksRefuseTrailingText(t *testing.T) {
	none := func(Member) error { return nil }
	noElem := func([]byte) error { return nil }
	for _, b := range []string{`{"a":1} x`, `{"a":1}{"b":2}`, `{}}`, `{"a":[1]}]`} {
		if Object([]byte(b), none) == nil {
			t.Fatalf("Object(%s): no error", b)
		}
		if CheckedObject([]byte(b), none) == nil {
			t.Errorf("CheckedObject(%s): no error", b)
		}
	}
	for _, b := range []string{`[1] x`, `[1][2]`, `[]]`, `[{}],`} {
		if Array([]byte(b), noElem) == nil {
			t.Fatalf("Array(%s): no error", b)
		}
		if CheckedArray([]byte(b), noElem) == nil {
			t.Errorf("CheckedArray(%s): no error", b)
		}
	}
	for _, b := range []string{"{\"a\":1} \n", "{}\t"} {
		if err := CheckedObject([]byte(b), none); err != nil {
			t.Errorf("CheckedObject(%q): %v", b, err)
		}
	}
	if err := CheckedArray([]byte("[1,2]\r\n"), noElem); err != nil {
		t.Errorf("CheckedArray: %v", err)
	}
}
