package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/regen-dev/regen/internal/monitor"
)

// demoInput computes, from the demo's input files alone, the sample ids a
// run must produce and the line numbers of the JSONL rows that cannot be
// samples (not JSON, no id, conversations not a list).
func demoInput(t *testing.T, dataDir string) (ids []string, badLines []int) {
	t.Helper()
	f, err := os.Open(filepath.Join(dataDir, "glaive_fc.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var row struct {
			ID            string `json:"id"`
			Conversations []json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil || row.ID == "" || len(row.Conversations) == 0 {
			badLines = append(badLines, n)
			continue
		}
		ids = append(ids, "B1_glaive/"+row.ID)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	type opencode struct {
		ID string `parquet:"id"`
	}
	rows, err := parquet.ReadFile[opencode](filepath.Join(dataDir, "opencode.parquet"))
	if err != nil {
		t.Fatalf("read demo parquet: %v", err)
	}
	for _, r := range rows {
		ids = append(ids, "B2_opencode/"+r.ID)
	}
	return ids, badLines
}

// TestE2EDemo runs the shipped demo twice from a copy, as a new user would:
// every good input sample comes out exactly once, the broken rows are dead
// letters with their file:line, and the second run adds nothing.
func TestE2EDemo(t *testing.T) {
	dir := t.TempDir()
	copyTree(t, "../../examples/demo/data", filepath.Join(dir, "data"))
	job, err := os.ReadFile("../../examples/demo/job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), job, 0o644); err != nil {
		t.Fatal(err)
	}

	want, badLines := demoInput(t, filepath.Join(dir, "data"))
	if diff := cmp.Diff([]int{43, 138, 253}, badLines); diff != "" {
		t.Fatalf("bad lines of the demo input (-want +got):\n%s", diff)
	}
	if len(want) != 600 {
		t.Fatalf("demo input has %d good samples, want 600", len(want))
	}

	first := regen(t, dir, "run", "job.yaml")
	if first.code != 0 {
		t.Fatalf("first run:\n%s", first)
	}
	t.Logf("first run: %s", first.dur.Round(1e6))
	if !strings.Contains(first.stdout, "ingest: 603 rows read: 600 new samples, 0 already stored, 3 bad rows") {
		t.Errorf("first run does not report 600 new samples and 3 bad rows:\n%s", first.stdout)
	}
	out := filepath.Join(dir, "out")
	ex1 := checkExport(t, out, "demo", want, true)

	wantDead := []deadRow{
		{Partition: "B1_glaive", Origin: ":43"},
		{Partition: "B1_glaive", Origin: ":138", Field: "conversations"},
		{Partition: "B1_glaive", Origin: ":253", Field: "id"},
	}
	checkDeadRows(t, ex1.dead, filepath.Join(dir, "data", "glaive_fc.jsonl"), wantDead)

	second := regen(t, dir, "run", "job.yaml")
	if second.code != 0 {
		t.Fatalf("second run:\n%s", second)
	}
	t.Logf("second run: %s", second.dur.Round(1e6))
	if !strings.Contains(second.stdout, ": 0 new samples, 600 already stored,") {
		t.Errorf("second run ingested new samples:\n%s", second.stdout)
	}
	ex2 := checkExport(t, out, "demo", want, true)
	if diff := cmp.Diff(shareGPTIDs(ex1.shareGPT), shareGPTIDs(ex2.shareGPT)); diff != "" {
		t.Errorf("second run changed the exported ids (-first +second):\n%s", diff)
	}
	checkDeadRows(t, ex2.dead, filepath.Join(dir, "data", "glaive_fc.jsonl"), wantDead)

	text := regen(t, dir, "status", "job.yaml")
	if text.code != 0 || !strings.Contains(text.stdout, "job demo: DONE") {
		t.Errorf("status after the run: want exit 0 and DONE\n%s", text)
	}
	if !strings.Contains(text.stdout, "bad source rows (dead letters at ingest): 3") {
		t.Errorf("status does not show the 3 bad rows:\n%s", text.stdout)
	}
	rep, res := status(t, dir, "job.yaml")
	if res.code != 0 || rep.State != monitor.Done {
		t.Errorf("status --json: exit %d state %s, want 0 DONE", res.code, rep.State)
	}
	if rep.Total.Done != 600 || rep.Total.Total != 600 || rep.IngestErrors != 3 {
		t.Errorf("status --json: total %+v, ingest errors %d; want 600 of 600 done and 3", rep.Total, rep.IngestErrors)
	}
}

// checkDeadRows checks the ingest dead letters: one per bad row, each with
// its file:line origin, the field when one field is at fault, and a reason.
func checkDeadRows(t *testing.T, got []deadRow, file string, want []deadRow) {
	t.Helper()
	var ingest []deadRow
	for _, d := range got {
		if d.Origin != "" {
			ingest = append(ingest, d)
		}
	}
	if len(ingest) != len(want) {
		t.Errorf("dead letters with an origin: got %d, want %d: %+v", len(ingest), len(want), ingest)
		return
	}
	for _, w := range want {
		origin := file + w.Origin
		found := false
		for _, d := range ingest {
			if d.Origin != origin {
				continue
			}
			found = true
			if d.Partition != w.Partition || d.Field != w.Field || d.Reason == "" {
				t.Errorf("dead letter %s: partition %q field %q reason %q; want partition %q field %q and a reason",
					origin, d.Partition, d.Field, d.Reason, w.Partition, w.Field)
			}
		}
		if !found {
			t.Errorf("no dead letter with origin %s in %+v", origin, ingest)
		}
	}
}
