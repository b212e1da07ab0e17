package source

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/regen-dev/regen/internal/job"
)

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.jsonl", `{"id":"1","question":"hi"}`+"\n"+`{"id":"2","question":"yo"}`+"\nnot json\n")
	write("b.jsonl", `{"id":"3","question":"hey"}`+"\n")
	demo, err := filepath.Abs("../../examples/demo/data/opencode.parquet")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("good glob", func(t *testing.T) {
		in, err := Inspect(ctx, job.Source{Partition: "p", Path: "*.jsonl", Prompt: "question", ID: "id"}, dir, 20)
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Files) != 2 || in.Rows != 4 || in.Good != 3 || len(in.Bad) != 1 || len(in.Missing) != 0 {
			t.Errorf("got %d files, %d rows, %d good, bad %v, missing %v; want 2, 4, 3, one bad, none", len(in.Files), in.Rows, in.Good, in.Bad, in.Missing)
		}
	})
	t.Run("first rows only", func(t *testing.T) {
		in, err := Inspect(ctx, job.Source{Partition: "p", Path: ".", Prompt: "question"}, dir, 2)
		if err != nil || in.Rows != 2 {
			t.Errorf("rows read = %d (%v), want 2", in.Rows, err)
		}
	})
	t.Run("field typo", func(t *testing.T) {
		in, err := Inspect(ctx, job.Source{Partition: "p", Path: "a.jsonl", Prompt: "questoin", ID: "id"}, dir, 20)
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Missing) != 1 || in.Missing[0].String() != `prompt: field "questoin" is in none of the rows read (they have: id, question)` {
			t.Errorf("missing = %v, want the prompt field named with the fields the rows have", in.Missing)
		}
	})
	t.Run("parquet column", func(t *testing.T) {
		in, err := Inspect(ctx, job.Source{Partition: "p", Path: demo, Prompt: "inputs", ID: "id"}, "", 20)
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Missing) != 1 || in.Missing[0].Field != "inputs" || !strings.Contains(in.Missing[0].String(), "input") {
			t.Errorf("missing = %v, want inputs, listing the real columns", in.Missing)
		}
		in, err = Inspect(ctx, job.Source{Partition: "p", Path: demo, Prompt: "input", ID: "id"}, "", 20)
		if err != nil || in.Good != 20 || len(in.Missing) != 0 {
			t.Errorf("demo parquet: %d good of %d, missing %v, err %v; want 20 good", in.Good, in.Rows, in.Missing, err)
		}
	})
	t.Run("no files", func(t *testing.T) {
		for _, p := range []string{"nope/*.jsonl", "missing.jsonl"} {
			if _, err := Inspect(ctx, job.Source{Partition: "p", Path: p, Prompt: "q"}, dir, 20); err == nil {
				t.Errorf("Inspect(%s) found files", p)
			}
		}
	})
}

// TestInspectHint: when every row read is bad because a mapped field holds
// another shape, the inspection names the option that fits; when some rows
// fit, the bad ones are the rows' fault and there is no hint.
func TestInspectHint(t *testing.T) {
	dir := t.TempDir()
	rows := map[string]string{
		"msgs.jsonl":  `{"m":[{"role":"user","content":"hi"}],"t":"hello"}`,
		"conv.jsonl":  `{"c":[{"from":"human","value":"hi"}]}`,
		"mixed.jsonl": `{"t":"hello"}` + "\n" + `{"t":["not","a","string"]}`,
	}
	for name, body := range rows {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Repeat(body+"\n", 3)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		src  job.Source
		want string
	}{
		{"prompt on a message list", job.Source{Path: "msgs.jsonl", Prompt: "m"}, "field m holds a message list: use messages: m"},
		{"messages on a string", job.Source{Path: "msgs.jsonl", Messages: "t"}, "field t holds a string: use prompt: t"},
		{"messages on from/value turns", job.Source{Path: "conv.jsonl", Messages: "c"}, "field c holds a ShareGPT conversation (from/value turns): use conversations: c"},
		{"some rows fit", job.Source{Path: "mixed.jsonl", Prompt: "t"}, ""},
		{"all fit", job.Source{Path: "msgs.jsonl", Messages: "m"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.src.Partition = "p"
			in, err := Inspect(context.Background(), tt.src, dir, 20)
			if err != nil {
				t.Fatal(err)
			}
			if got := in.Hint.String(); got != tt.want {
				t.Errorf("hint = %q, want %q (%d rows, %d good)", got, tt.want, in.Rows, in.Good)
			}
		})
	}
}
