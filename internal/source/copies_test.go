package source

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/conversation"
	"github.com/regen-dev/regen/internal/job"
)

// TestSamplesPerPrompt: with k > 1 every row becomes k samples "<id>#j",
// j from 0, each with the row's prompt and its own seed; with k = 1 ids and
// bodies are those of a job without the option; the limit counts rows.
func TestSamplesPerPrompt(t *testing.T) {
	dir := t.TempDir()
	rows := `{"id":"a","q":"first"}
{"id":"b","q":"second"}
{"q":"no id","id":"c"}
`
	if err := os.WriteFile(filepath.Join(dir, "d.jsonl"), []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	one := job.Source{Partition: "P", Path: "d.jsonl", Prompt: "q", ID: "id"}
	base, _, _, err := readAll(t, Options{}, one, dir)
	if err != nil {
		t.Fatal(err)
	}
	three := one
	three.SamplesPerPrompt = 3
	three.Limit = 2
	got, _, st, err := readAll(t, Options{}, three, dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Good != 2 {
		t.Errorf("good rows %d, want 2 (the limit counts rows, not samples)", st.Good)
	}
	var ids []string
	seeds := map[int64]string{}
	for i, g := range got {
		ids = append(ids, g.ID)
		b := base[i/3]
		if g.Origin != b.Origin || g.Tokens != b.Tokens {
			t.Errorf("%s: origin %s tokens %d, want the row's %s %d", g.ID, g.Origin, g.Tokens, b.Origin, b.Tokens)
		}
		p, err := conversation.Decode([]byte(g.Body))
		if err != nil {
			t.Fatalf("%s: %v", g.ID, err)
		}
		if p.Seed == nil {
			t.Fatalf("%s: body %s has no seed", g.ID, g.Body)
		}
		if *p.Seed != Seed(g.ID) || *p.Seed < 0 || *p.Seed > 1<<31-1 {
			t.Errorf("%s: seed %d, want Seed(id) = %d within 0..2^31-1", g.ID, *p.Seed, Seed(g.ID))
		}
		if other, ok := seeds[*p.Seed]; ok {
			t.Errorf("%s and %s share seed %d", g.ID, other, *p.Seed)
		}
		seeds[*p.Seed] = g.ID
		var bodyNoSeed, baseBody map[string]json.RawMessage
		_ = json.Unmarshal([]byte(g.Body), &bodyNoSeed)
		_ = json.Unmarshal([]byte(b.Body), &baseBody)
		delete(bodyNoSeed, "seed")
		if diff := cmp.Diff(baseBody, bodyNoSeed); diff != "" {
			t.Errorf("%s: body other than the seed differs from the row's (-row +sample):\n%s", g.ID, diff)
		}
	}
	want := []string{"P/a#0", "P/a#1", "P/a#2", "P/b#0", "P/b#1", "P/b#2"}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
	for _, b := range base {
		if p, err := conversation.Decode([]byte(b.Body)); err != nil || p.Seed != nil {
			t.Errorf("k=1 sample %s: body %s; want no seed", b.ID, b.Body)
		}
	}
	if base[0].ID != "P/a" {
		t.Errorf("k=1 id %q, want P/a (no suffix)", base[0].ID)
	}
}

// TestSamplesPerPromptWithoutID: without an id mapping the k ids hang off
// the content hash, so identical rows give the same k ids (one prompt's k
// samples), and distinct rows distinct ones.
func TestSamplesPerPromptWithoutID(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.jsonl"), []byte("{\"q\":\"same\"}\n{\"q\":\"same\"}\n{\"q\":\"other\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := job.Source{Partition: "P", Path: "d.jsonl", Prompt: "q", SamplesPerPrompt: 2}
	got, _, _, err := readAll(t, Options{}, src, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 {
		t.Fatalf("%d samples, want 6 (2 per row)", len(got))
	}
	for j := range 2 {
		if got[j].ID != got[2+j].ID || got[j].Body != got[2+j].Body {
			t.Errorf("identical rows: sample %d is %s, the repeat's %s; want the same id and body", j, got[j].ID, got[2+j].ID)
		}
		if want := fmt.Sprintf("#%d", j); got[j].ID[len(got[j].ID)-2:] != want {
			t.Errorf("id %s, want suffix %s", got[j].ID, want)
		}
	}
	if got[4].ID == got[0].ID {
		t.Errorf("distinct rows share id %s", got[0].ID)
	}
}
