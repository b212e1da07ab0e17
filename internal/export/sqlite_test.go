package export

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/llm"
	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/sqlite"
)

// TestExportFromSQLite runs the real backend through a job's life and
// checks the export holds each finished sample exactly once.
func TestExportFromSQLite(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var samples []store.NewSample
	for i := range 30 {
		samples = append(samples, store.NewSample{
			ID: fmt.Sprintf("id%02d", i), Partition: "P", Lane: "short",
			Body: []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"q%d"}]}`, i)), PromptTokens: 3, Origin: fmt.Sprintf("in.jsonl:%d", i+1),
		})
	}
	if _, err := st.Ingest(ctx, samples); err != nil {
		t.Fatal(err)
	}
	if err := st.AddIngestErrors(ctx, []store.IngestError{{Partition: "P", Origin: "in.jsonl:31", Reason: "invalid JSON"}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, "short", 30, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wantDone := map[string]bool{}
	for i, c := range claimed {
		switch {
		case i%10 == 3:
			err = st.DeadLetter(ctx, c.ID, "w1", "bad-request: context too long")
		case i%10 == 5:
			err = st.Reject(ctx, c.ID, "w1", store.Result{Response: []byte(`{"content":""}`), FinishReason: "stop"}, "empty", "empty content and no tool call")
		case i%10 == 7:
			continue // still leased: not finished, not exported
		default:
			res, _ := json.Marshal(llm.Result{Content: "a " + c.ID, FinishReason: "stop", Usage: llm.Usage{PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5}})
			err = st.Complete(ctx, c.ID, "w1", store.Result{Response: res, FinishReason: "stop", PromptTokens: 3, CompletionTokens: 2, Endpoint: "e"})
			wantDone[c.ID] = true
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	sum, err := Export(ctx, st, dir, Formats, "job")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := [5]int{sum.Done, sum.Truncated, sum.Rejected, sum.Dead, sum.BadRows}, [5]int{21, 0, 3, 3, 1}; got != want {
		t.Errorf("summary done/truncated/rejected/dead/bad = %v, want %v", got, want)
	}
	gotDone := map[string]bool{}
	for _, m := range readLines(t, filepath.Join(dir, DataDir, "job.sharegpt.jsonl")) {
		id := m["id"].(string)
		if gotDone[id] {
			t.Errorf("sample %s exported twice", id)
		}
		gotDone[id] = true
	}
	if diff := cmp.Diff(wantDone, gotDone); diff != "" {
		t.Errorf("exported ids mismatch (-want +got):\n%s", diff)
	}
	if got := len(readLines(t, filepath.Join(dir, "job.dead.jsonl"))); got != 4 {
		t.Errorf("dead.jsonl has %d lines, want 4 (3 dead samples + 1 bad row)", got)
	}
}

// noListStore refuses to list bad source rows: export must stream them,
// since a wrong field mapping makes every source row bad.
type noListStore struct{ store.Store }

func (noListStore) IngestErrors(context.Context, int) ([]store.IngestError, error) {
	return nil, errors.New("export listed every bad source row")
}

// TestExportStreamsBadRows exports a job whose every source row was bad,
// more rows than one store page, recorded twice and in an order that is
// not the origins' string order: dead.jsonl lists them in the order first
// recorded, which ingest makes the source order.
func TestExportStreamsBadRows(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const n = 2500
	var bad []store.IngestError
	var want []string
	for i := n - 1; i >= 0; i-- {
		o := fmt.Sprintf("in.jsonl:%05d", i)
		bad = append(bad, store.IngestError{Partition: "P", Origin: o, Field: "input", Reason: "field input: missing"})
		want = append(want, o)
	}
	for range 2 { // re-ingesting the same file records nothing new
		if err := st.AddIngestErrors(ctx, bad); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	sum, err := Export(ctx, noListStore{st}, dir, []string{FormatShareGPT}, "job")
	if err != nil {
		t.Fatal(err)
	}
	if sum.BadRows != n {
		t.Errorf("BadRows = %d, want %d", sum.BadRows, n)
	}
	var got []string
	for _, m := range readLines(t, filepath.Join(dir, "job.dead.jsonl")) {
		got = append(got, m["origin"].(string))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead.jsonl origins (-want +got):\n%s", diff)
	}
}
