package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// checkDemoConversations reads the demo's accepted records as training data:
// glaive's chats come out with every answer regenerated, its system prompts
// without the "SYSTEM:" artefact, and no record carries run details.
func checkDemoConversations(t *testing.T, dir string, ex exported) {
	t.Helper()
	answers := map[int]int{}
	for _, raw := range readJSONL(t, filepath.Join(dir, "out", "data", "demo.sharegpt.jsonl")) {
		var r struct {
			ID            string `json:"id"`
			Endpoint      *string
			Attempts      *int
			Conversations []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"conversations"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		if r.Endpoint != nil || r.Attempts != nil {
			t.Errorf("%s: run details in a minimal record: %.200s", r.ID, raw)
		}
		n := 0
		for _, m := range r.Conversations {
			if m.Role == "assistant" {
				n++
			}
			if m.Role == "system" && strings.HasPrefix(m.Content, "SYSTEM:") {
				t.Errorf("%s: system prompt keeps the SYSTEM: prefix", r.ID)
			}
			// The dataset's own answers never reach the training file.
			if m.Role == "assistant" && (m.Content == "Here is a short answer." || m.Content == "Of course." || m.Content == "Let me look that up for you.") {
				t.Errorf("%s: the dataset's answer %q was exported instead of the model's", r.ID, m.Content)
			}
		}
		if strings.HasPrefix(r.ID, "B1_glaive/") {
			answers[n]++
		}
	}
	t.Logf("glaive records by regenerated answers: %v; rejected %d", answers, len(ex.rejected))
	if answers[2] == 0 || answers[3] == 0 {
		t.Errorf("glaive records with 2 and 3 regenerated answers: %v, want some of each", answers)
	}
}

// checkDemoStats runs regen stats on the finished demo.
func checkDemoStats(t *testing.T, dir string, ex exported) {
	t.Helper()
	text := regen(t, dir, "stats", "job.yaml")
	if text.code != 0 || !strings.Contains(text.stdout, "job demo: 600 samples") || !strings.Contains(text.stdout, "B2_opencode") {
		t.Errorf("regen stats:\n%s", text)
	}
	js := regen(t, dir, "stats", "--json", "job.yaml")
	var rep struct {
		Version int
		Total   struct {
			Samples struct{ Total, Done, Rejected int }
			Answers int
		}
		Rejects []struct {
			Rule string
			N    int
		}
		BadRows    int `json:"bad_rows"`
		Throughput []struct {
			Answers int
		}
		BucketSeconds int `json:"bucket_seconds"`
	}
	if err := json.Unmarshal([]byte(js.stdout), &rep); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, js)
	}
	rejected := 0
	for _, r := range rep.Rejects {
		rejected += r.N
	}
	if rep.Version != 1 || rep.Total.Samples.Total != 600 || rep.Total.Samples.Done != len(ex.shareGPT) ||
		rejected != len(ex.rejected) || rep.BadRows != 3 || rep.Total.Answers <= 600 {
		t.Errorf("stats --json = %+v; want version 1, 600 samples, %d done, %d rejected, 3 bad rows, more answers than samples",
			rep, len(ex.shareGPT), len(ex.rejected))
	}
	// The demo lasts seconds: its throughput is drawn in buckets of
	// seconds that hold every answer, not as one bar of a minute.
	answers := 0
	for _, p := range rep.Throughput {
		answers += p.Answers
	}
	if rep.BucketSeconds < 1 || rep.BucketSeconds >= 60 || len(rep.Throughput) < 2 || answers != rep.Total.Answers {
		t.Errorf("stats throughput: %d buckets of %d s holding %d answers; want several buckets of seconds holding all %d",
			len(rep.Throughput), rep.BucketSeconds, answers, rep.Total.Answers)
	}
}

// checkDeadRows checks the ingest dead letters: one per bad row, each with
// its file:line origin, the field when one field is at fault, and a reason.
