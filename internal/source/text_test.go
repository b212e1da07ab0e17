package source

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/job"
)

// TestInvalidText: a JSONL line with bytes that are not UTF-8 or a \u
// escape of a lone surrogate is named with the byte; valid text, escaped
// pairs and an escaped backslash before "u" are not.
func TestInvalidText(t *testing.T) {
	tests := []struct {
		name, line, want string
	}{
		{"ascii", `{"q":"hi"}`, ""},
		{"utf-8", `{"q":"héllo 😀"}`, ""},
		{"escaped pair", `{"q":"\ud83d\ude00"}`, ""},
		{"escaped BMP", `{"q":"\u00e9\u4e2d"}`, ""},
		{"escaped backslash", `{"q":"\\ud800"}`, ""},
		{"invalid byte", "{\"q\":\"a\xffb\"}", "invalid UTF-8 at byte 8 (0xff)"},
		{"cut multi-byte", "{\"q\":\"\xc3\"}", "invalid UTF-8 at byte 7 (0xc3)"},
		{"UTF-16 surrogate as bytes", "{\"q\":\"\xed\xa0\x80\"}", "invalid UTF-8 at byte 7 (0xed)"},
		{"lone high", `{"q":"ab\ud800"}`, `lone UTF-16 surrogate \ud800 at byte 9`},
		{"lone low", `{"q":"\uDC00x"}`, `lone UTF-16 surrogate \uDC00 at byte 7`},
		{"high then non-low", `{"q":"\ud800\u0041"}`, `lone UTF-16 surrogate \ud800 at byte 7`},
		{"high at the end", `{"q":"\ud800`, `lone UTF-16 surrogate \ud800 at byte 7`},
		{"after a pair", `{"q":"\ud83d\ude00\udc00"}`, `lone UTF-16 surrogate \udc00 at byte 19`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := invalidText([]byte(tt.line))
			if tt.want == "" && got != "" || !strings.HasPrefix(got, tt.want) {
				t.Errorf("invalidText(%q) = %q, want prefix %q", tt.line, got, tt.want)
			}
		})
	}
}

// TestReadInvalidTextDeadLetters: rows whose text is not valid Unicode are
// dead letters with file:line and the byte, not samples with U+FFFD in
// them; the rows around them are read as before. Parquet strings too.
func TestReadInvalidTextDeadLetters(t *testing.T) {
	dir := t.TempDir()
	lines := []string{
		`{"id":"a","q":"fine"}`,
		"{\"id\":\"b\",\"q\":\"caf\xe9\"}", // Latin-1, not UTF-8
		`{"id":"c","q":"x\ud800y"}`,
		`{"id":"d","q":"\ud83d\ude00 ok"}`,
	}
	if err := os.WriteFile(filepath.Join(dir, "t.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := job.Source{Partition: "T", Path: "t.jsonl", Prompt: "q", ID: "id"}
	samples, bads, _, err := readAll(t, Options{}, src, dir)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "t.jsonl") + ":"
	want := []BadRow{
		{"T", p + "2", "", "invalid UTF-8 at byte 19 (0xe9): the text would be altered, not sent as written; fix the file's encoding"},
		{"T", p + "3", "", `lone UTF-16 surrogate \ud800 at byte 17: not a character, the text would be altered, not sent as written; fix the escape`},
	}
	if diff := cmp.Diff(want, bads); diff != "" {
		t.Errorf("bad rows (-want +got):\n%s", diff)
	}
	if len(samples) != 2 || samples[0].ID != "T/a" || samples[1].ID != "T/d" || !strings.Contains(samples[1].Body, "😀 ok") {
		t.Errorf("samples = %+v, want T/a and T/d with its emoji", samples)
	}

	// Parquet: the writer keeps the bytes as given.
	pq := filepath.Join(dir, "t.parquet")
	writeParquet(t, pq, []pqRow{{ID: "r0", Prompt: "fine"}, {ID: "r1", Prompt: "caf\xe9"}})
	src = job.Source{Partition: "T", Path: "t.parquet", Prompt: "prompt", ID: "id"}
	samples, bads, _, err = readAll(t, Options{}, src, dir)
	if err != nil {
		t.Fatal(err)
	}
	want = []BadRow{{"T", pq + ":row 1", "prompt", "invalid UTF-8 at byte 4 of field prompt (0xe9): the text would be altered, not sent as written; fix the file's encoding"}}
	if diff := cmp.Diff(want, bads); diff != "" {
		t.Errorf("parquet bad rows (-want +got):\n%s", diff)
	}
	if len(samples) != 1 || samples[0].ID != "T/r0" {
		t.Errorf("parquet samples = %+v, want T/r0 alone", samples)
	}
}

// BenchmarkInvalidText measures the check on a 1 KB ShareGPT line with
// escapes, against decoding the same line (the cost it adds to ingest).
func BenchmarkInvalidText(b *testing.B) {
	line := []byte(`{"id":"x","conversations":[{"from":"human","value":"` + strings.Repeat(`caf\u00e9 na\u00efve text `, 40) + `"},{"from":"gpt","value":"ok \ud83d\ude00"}]}`)
	b.Run("check", func(b *testing.B) {
		b.SetBytes(int64(len(line)))
		for b.Loop() {
			if invalidText(line) != "" {
				b.Fatal("valid line refused")
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(line)))
		var d decoder
		for b.Loop() {
			if _, reason := d.object(line); reason != "" {
				b.Fatal(reason)
			}
		}
	})
}
