package job

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// jobHead is a valid job up to an open generation.extra mapping.
const jobHead = `name: bomb
sources:
  - {partition: p, path: p.jsonl, prompt: q}
endpoints:
  - url: http://localhost:8000
generation:
  extra:
`

// aliasBomb returns a job whose generation.extra holds levels of
// fan-fold aliases (the was 9 x 9 in 546 bytes), each level a
// list or, with maps, a mapping of fan aliases of the level before.
func aliasBomb(levels, fan int, maps bool) string {
	var b strings.Builder
	b.WriteString(jobHead)
	fmt.Fprintf(&b, "    l0: &l0 [%s]\n", strings.TrimSuffix(strings.Repeat(`"x",`, fan), ","))
	for i := 1; i < levels; i++ {
		items := make([]string, fan)
		for j := range items {
			items[j] = fmt.Sprintf("*l%d", i-1)
			if maps {
				items[j] = fmt.Sprintf("k%d: *l%d", j, i-1)
			}
		}
		open, end := "[", "]"
		if maps {
			open, end = "{", "}"
		}
		fmt.Fprintf(&b, "    l%d: &l%d %s%s%s\n", i, i, open, strings.Join(items, ", "), end)
	}
	return b.String()
}

// TestAliasBombRefused: nine levels of nine-fold aliases (17.6 GB once
// expanded) are refused at the alias that passes the budget, naming the
// file, line and field, with little memory allocated on the way.
func TestAliasBombRefused(t *testing.T) {
	tests := []struct {
		name      string
		src       string
		wantField string
		wantLine  int
	}{
		// Levels hold 10, 91, 820, 7381, 66430 values: the aliases of
		// l1..l4 add 74718, and l5's first alias of l4 passes 100000.
		{"lists", aliasBomb(9, 9, false), "generation.extra.l5[0]", 13},
		{"mappings", aliasBomb(9, 9, true), "generation.extra.l5.k0", 13},
		// A merge key repeats its anchor's pairs too.
		{"merge keys", jobHead + "    l0: &l0 {a: 1, b: 2}\n" + strings.Join(mergeLevels(12), ""), "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "job.yaml")
			if err := os.WriteFile(path, []byte(tt.src), 0o644); err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s, err := Load(path)
			runtime.ReadMemStats(&after)
			var fe *FieldError
			if s != nil || !errors.As(err, &fe) {
				t.Fatalf("Load(bomb) = %v, %v; want a *FieldError", s, err)
			}
			if fe.File != path || !strings.Contains(fe.Msg, "alias") || !strings.Contains(fe.Msg, "100000 values") {
				t.Errorf("error %q: want the file %s and the alias budget named", err, path)
			}
			if tt.wantField != "" && (fe.Field != tt.wantField || fe.Line != tt.wantLine) {
				t.Errorf("refused at line %d field %q, want line %d field %q (%v)", fe.Line, fe.Field, tt.wantLine, tt.wantField, err)
			}
			if !strings.HasPrefix(fe.Field, "generation.extra.") || fe.Line == 0 {
				t.Errorf("error %q does not name the line and field", err)
			}
			// Everything allocated while loading, freed or not.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 100<<20 {
				t.Errorf("loading the bomb allocated %d MB, want < 100 MB", grew>>20)
			}
		})
	}
}

// mergeLevels makes levels of mappings each merging the level before
// twice under new keys and once by a merge key.
func mergeLevels(levels int) []string {
	var out []string
	for i := 1; i < levels; i++ {
		out = append(out, fmt.Sprintf("    l%d: &l%d {<<: *l%d, x: *l%d, y: *l%d, z: *l%d}\n", i, i, i-1, i-1, i-1, i-1))
	}
	return out
}

// TestAliasesWithinBudget: aliases a job writes by hand load and expand as
// before.
func TestAliasesWithinBudget(t *testing.T) {
	src := jobHead + `    stop: &stop ["END", "STOP"]
    stop_token_ids: [1, 2]
    extra_body: {stops: *stop, again: *stop}
`
	s, err := Parse("job.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	params, err := s.Generation.Params()
	if err != nil {
		t.Fatal(err)
	}
	got := string(params["extra_body"])
	want := `{"again":["END","STOP"],"stops":["END","STOP"]}`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("extra_body (-want +got):\n%s", diff)
	}
}

// TestJobFileSizeCap: a job file over MaxFileBytes is refused by name
// without being read whole; one at the cap loads.
func TestJobFileSizeCap(t *testing.T) {
	dir := t.TempDir()
	base := "name: big\nsources:\n  - {partition: p, path: p.jsonl, prompt: q}\nendpoints:\n  - url: http://localhost:8000\n"
	pad := func(n int) []byte {
		b := []byte(base)
		for len(b) < n {
			b = append(b, "# padding: a comment line, never a setting\n"...)
		}
		return b[: n-1 : n-1]
	}
	tests := []struct {
		name   string
		size   int
		refuse bool
	}{
		{"at the cap", MaxFileBytes, false},
		{"one byte over", MaxFileBytes + 1, true},
		{"100 MB", 100 << 20, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "job.yaml")
			// Past the cap the bytes are never parsed: a sparse tail will do.
			src := append(pad(min(tt.size, MaxFileBytes+1)), '\n')
			if err := os.WriteFile(path, src, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, int64(tt.size)); err != nil {
				t.Fatal(err)
			}
			s, err := Load(path)
			if !tt.refuse {
				if err != nil || s.Name != "big" {
					t.Fatalf("Load(%d bytes) = %v; want the job", tt.size, err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.File != path || !strings.Contains(fe.Msg, "larger than 4 MiB") {
				t.Errorf("Load(%d bytes) = %v; want a refusal naming %s and the 4 MiB cap", tt.size, err, path)
			}
			if _, err := Parse(path, src); !errors.As(err, &fe) {
				t.Errorf("Parse(%d bytes) = %v; want the same refusal", len(src), err)
			}
		})
	}
}

// TestLoadContextInterrupted: a load asked for after an interrupt returns
// the interrupt, not the job.
func TestLoadContextInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s, err := LoadContext(ctx, "testdata/minimal.yaml"); s != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("LoadContext(cancelled) = %v, %v; want context.Canceled", s, err)
	}
	if s, err := LoadContext(context.Background(), "testdata/minimal.yaml"); err != nil || s.Name != "min/job" {
		t.Errorf("LoadContext = %v; want the job", err)
	}
}

// BenchmarkAliasBomb measures the refusal of the bomb (the
// acceptance asks for well under a second).
func BenchmarkAliasBomb(b *testing.B) {
	src := []byte(aliasBomb(9, 9, false))
	for b.Loop() {
		if _, err := Parse("job.yaml", src); err == nil {
			b.Fatal("bomb accepted")
		}
	}
}

// byteBomb is the job file: a 1 MiB string anchored in
// generation.extra and a block list of n aliases of it (1 MB written,
// n MiB once expanded, far under the alias value cap).
func byteBomb(n int) string {
	var b strings.Builder
	b.WriteString(jobHead)
	fmt.Fprintf(&b, "    s: &s \"%s\"\n    l:\n", strings.Repeat("x", 1<<20))
	b.WriteString(strings.Repeat("      - *s\n", n))
	return b.String()
}

// TestAliasBombByBytes: 3,000 aliases of a 1 MiB string (3 GB once
// expanded, 3,001 values) are refused at the alias that takes the text
// past MaxAliasedBytes, with the line, the field and the byte figures,
// allocating little more than the file itself.
func TestAliasBombByBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.yaml")
	src := byteBomb(3000)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	s, err := Load(path)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	var fe *FieldError
	if s != nil || !errors.As(err, &fe) {
		t.Fatalf("Load(byte bomb) = %v, %v; want a *FieldError", s, err)
	}
	// jobHead is 7 lines, then s: and l:; the fifth alias (line 14) takes
	// the expanded text to 5 MiB, past the 4 MiB budget.
	if fe.File != path || fe.Line != 14 || fe.Field != "generation.extra.l[4]" {
		t.Errorf("refused at %s:%d %q, want %s:14 generation.extra.l[4] (%v)", fe.File, fe.Line, fe.Field, path, err)
	}
	for _, want := range []string{"alias *s repeats 1048576 bytes", "past 4194304 bytes (4 MiB)"} {
		if !strings.Contains(fe.Msg, want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	grew := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d-byte file refused in %s, %d MB allocated (peak heap at most that)", len(src), took.Round(time.Millisecond), grew>>20)
	if grew > 100<<20 {
		t.Errorf("loading the byte bomb allocated %d MB, want < 100 MB", grew>>20)
	}
}

// TestAliasedBytesWithinBudget: a long system prompt shared by aliases
// loads while the expanded text stays under the budget.
func TestAliasedBytesWithinBudget(t *testing.T) {
	s, err := Parse("job.yaml", []byte(byteBomb(4)))
	if err != nil {
		t.Fatalf("four aliases of 1 MiB (4 MiB, at the budget): %v", err)
	}
	params, err := s.Generation.Params()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(params["l"]); n < 4<<20 {
		t.Errorf("extra l is %d bytes, want the four strings expanded", n)
	}
}

// TestClip: values longer than a line are cut on a rune boundary with a
// marker of what was left out; shorter ones are left alone.
func TestClip(t *testing.T) {
	tests := []struct{ in, want string }{
		{"short", "short"},
		{strings.Repeat("x", 10), strings.Repeat("x", 10)},
		{strings.Repeat("x", 12), "xxxxxxxxxx...[2 more bytes]"},
		{"xxxxxxxxxé", "xxxxxxxxx...[2 more bytes]"}, // é is 2 bytes: not split
	}
	for _, tt := range tests {
		if got := Clip(tt.in, 10); got != tt.want {
			t.Errorf("Clip(%q, 10) = %q, want %q", tt.in, got, tt.want)
		}
	}
	fe := &FieldError{File: "job.yaml", Line: 3, Field: "name", Msg: "bad value " + strings.Repeat("y", 1<<20)}
	if got := fe.Error(); len(got) > 1000 || !strings.Contains(got, "more bytes]") {
		t.Errorf("a 1 MiB message printed as %d bytes, want it clipped with a marker", len(got))
	}
}

// TestConfigDiffClipsLongValues: a changed 1 MiB system prompt is shown
// cut, from a little before its first difference, so the change stays
// visible in a line of a few hundred bytes.
func TestConfigDiffClipsLongValues(t *testing.T) {
	long := strings.Repeat("You are helpful. ", 60_000)
	a := fmt.Sprintf(`{"sources":[{"system":%q}]}`, long+"Be kind.")
	b := fmt.Sprintf(`{"sources":[{"system":%q}]}`, long+"Be terse.")
	lines, err := ConfigDiff([]byte(a), []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1 || len(lines[0]) > 1000 {
		t.Fatalf("diff: %d lines, first %d bytes; want one line under 1000 bytes", len(lines), len(lines[0]))
	}
	for _, want := range []string{"bytes alike]...", "Be kind.", "Be terse."} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("diff line %q lacks %q", lines[0], want)
		}
	}
	// Short values are shown whole, as before.
	lines, _ = ConfigDiff([]byte(`{"generation":{"temperature":0.7}}`), []byte(`{"generation":{"temperature":1.3}}`))
	if len(lines) != 1 || lines[0] != "generation.temperature: 0.7 -> 1.3" {
		t.Errorf("short diff = %q", lines)
	}
}
