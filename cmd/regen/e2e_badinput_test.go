package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/monitor"
)

// TestE2EBadInput runs a job whose sources mix good rows with every kind of
// broken one (testdata/badinput): each good row is generated exactly once,
// each bad row is a dead letter with its file:line and field, and a second
// run adds nothing.
func TestE2EBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	copyTree(t, "testdata/badinput", dir)
	// A ~2 MB line is a good row: far below the reader's 64 MiB line cap.
	huge, err := json.Marshal(map[string]string{
		"id": "huge", "question": "Summarize the attached notes.", "notes": strings.Repeat("notes ", 350_000),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompts", "b_huge.jsonl"),
		append(append(huge, '\n'), `{"id":"p7","question":"The prompt after the huge line."}`+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}

	want := []string{"P/p1", "P/p2", "P/p6", "P/huge", "P/p7", "C/c1", "C/c6", "C/c7"}
	// Origins are relative to the job file, in the store and in the files.
	a := filepath.Join("prompts", "a.jsonl")
	chats := "chats.jsonl"
	wantDead := []deadRow{
		{Partition: "P", Origin: a + ":3"},                             // unterminated JSON
		{Partition: "P", Origin: a + ":5", Field: "question"},          // prompt missing
		{Partition: "P", Origin: a + ":6", Field: "question"},          // prompt is a number
		{Partition: "P", Origin: a + ":7", Field: "id"},                // id is a list
		{Partition: "P", Origin: a + ":8"},                             // not JSON at all
		{Partition: "C", Origin: chats + ":2", Field: "conversations"}, // empty conversation
		{Partition: "C", Origin: chats + ":3", Field: "conversations"}, // a string, not turns
		{Partition: "C", Origin: chats + ":4", Field: "id"},            // id missing
		{Partition: "C", Origin: chats + ":5", Field: "conversations[0].value"},
		{Partition: "C", Origin: chats + ":6", Field: "conversations"}, // only an assistant turn: nothing to answer
		{Partition: "C", Origin: chats + ":8"},                         // an array, not an object
	}

	first := regen(t, dir, "run", "job.yaml")
	if first.code != 0 {
		t.Fatalf("run:\n%s", first)
	}
	if !strings.Contains(first.stdout, "ingest: 19 rows read: 8 new samples, 0 already stored, 11 bad rows") {
		t.Errorf("run does not report 8 good and 11 bad rows:\n%s", first.stdout)
	}
	out := filepath.Join(dir, "out")
	ex := checkExport(t, out, "bad", want, false)
	checkBadRows(t, ex.dead, wantDead)
	var huge1 *sharegptRow
	for i := range ex.shareGPT {
		if ex.shareGPT[i].ID == "P/huge" {
			huge1 = &ex.shareGPT[i]
		}
	}
	if huge1 == nil || huge1.Usage.PromptTokens == 0 {
		t.Errorf("the huge row's result: %+v, want a result with prompt tokens", huge1)
	}

	text := regen(t, dir, "status", "job.yaml")
	if text.code != 0 || !strings.Contains(text.stdout, "job bad: DONE") ||
		!strings.Contains(text.stdout, "bad source rows (dead letters at ingest): 11") {
		t.Errorf("status: want exit 0, DONE and 11 bad source rows\n%s", text)
	}
	rep, _ := status(t, dir, "job.yaml")
	if rep.State != monitor.Done || rep.IngestErrors != 11 || rep.Total.Done != len(want) || rep.Total.Total != len(want) {
		t.Errorf("status --json: state %s, %d ingest errors, total %+v; want DONE, 11, %d of %d done",
			rep.State, rep.IngestErrors, rep.Total, len(want), len(want))
	}

	second := regen(t, dir, "run", "job.yaml")
	if second.code != 0 {
		t.Fatalf("second run:\n%s", second)
	}
	if !strings.Contains(second.stdout, "ingest: 19 rows in 4 files unchanged since the last ingest, not read again: 0 new samples, 8 already stored, 11 bad rows") {
		t.Errorf("second run: want 0 new samples:\n%s", second.stdout)
	}
	ex2 := checkExport(t, out, "bad", want, false)
	checkBadRows(t, ex2.dead, wantDead)
	rep2, _ := status(t, dir, "job.yaml")
	if rep2.IngestErrors != 11 || rep2.Total.Total != len(want) {
		t.Errorf("after the second run: %d ingest errors and %d samples, want 11 and %d", rep2.IngestErrors, rep2.Total.Total, len(want))
	}
}

// checkBadRows wants exactly the ingest dead letters of want (matched by
// origin), each with a reason.
func checkBadRows(t *testing.T, got, want []deadRow) {
	t.Helper()
	var g []deadRow
	for _, d := range got {
		if d.Reason == "" {
			t.Errorf("dead letter %s has no reason", d.Origin)
		}
		d.Reason = ""
		g = append(g, d)
	}
	sortDead := func(d []deadRow) {
		slices.SortFunc(d, func(a, b deadRow) int { return strings.Compare(a.Origin, b.Origin) })
	}
	w := append([]deadRow(nil), want...)
	sortDead(g)
	sortDead(w)
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
}

// TestE2EValidate checks that `regen validate` reports each problem of a
// broken job file as file:line: field: message and exits 1. All problems
// come in one run: a bad key or setting does not hide the sources' and
// the output folder's (issue 21: four problems took three runs).
func TestE2EValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file string
		want []string // "line field" of each problem, in output order
	}{
		{"lanes.yaml", []string{
			"7 lanes[0].concurrency",
			"9 lanes[1].name",
			"10 lanes[1].max_tokens",
			"4 sources[0].path",
		}},
		{"fields.yaml", []string{
			"5 sources[0]",
			"9 sources[1].partition",
			"9 sources[1].path",
			"12 generation.temperature",
			"13 generation.top_p",
			"3 endpoints[0].url",
		}},
		{"unknown.yaml", []string{
			"8 lanes[0].max_tokns",
			"4 sources[0].path",
		}},
		{"stages.yaml", []string{
			"17 lanes[0].max_tokns",
			"19 generation.temperature",
			"9 sources[0].prompt",
			"12 sources[1].path",
			"21 output.dir",
		}},
	}
	dir := t.TempDir()
	copyTree(t, "testdata/validate", dir)
	if err := os.WriteFile(filepath.Join(dir, "blocker"), []byte("a file, not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			res := regen(t, dir, "validate", tt.file)
			if res.code != 1 {
				t.Fatalf("want exit 1:\n%s", res)
			}
			// file:line[:col]: field: message
			re := regexp.MustCompile(`^` + regexp.QuoteMeta(tt.file) + `:(\d+)(?::\d+)?: (\S+): (.+)$`)
			lines := strings.Split(strings.TrimRight(res.stderr, "\n"), "\n")
			var got []string
			for _, l := range lines[:len(lines)-1] {
				m := re.FindStringSubmatch(l)
				if m == nil {
					t.Errorf("line %q is not file:line: field: message", l)
					continue
				}
				got = append(got, m[1]+" "+m[2])
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s\nstderr:\n%s", diff, res.stderr)
			}
			if last := lines[len(lines)-1]; !strings.HasSuffix(last, ": "+strconv.Itoa(len(tt.want))+" problem(s)") {
				t.Errorf("last line %q, want the problem count %d", last, len(tt.want))
			}
		})
	}
}
