package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

func TestRequeueCommand(t *testing.T) {
	dir := t.TempDir()
	jobPath := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobPath, []byte(`name: rq
endpoints: [{url: "http://127.0.0.1:1"}]
sources: [{partition: p, path: data.jsonl, prompt: prompt}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runRequeue(context.Background(), &out, jobPath, requeueOptions{}); err == nil || !strings.Contains(err.Error(), "no store yet") {
		t.Fatalf("requeue before any run = %v, want a clear refusal", err)
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := st.Ingest(ctx, []store.NewSample{{ID: "a", Partition: "p", Lane: "default", Body: []byte(`{}`)}, {ID: "b", Partition: "p", Lane: "default", Body: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, "default", 2, "w", time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	for _, c := range claimed {
		if err := st.DeadLetter(ctx, c.ID, "w", "bad-request (HTTP 400): unknown field top_k "+c.ID); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	if err := runRequeue(ctx, &out, jobPath, requeueOptions{reason: "top_k a"}); err != nil {
		t.Fatal(err)
	}
	if err := runRequeue(ctx, &out, jobPath, requeueOptions{}); err != nil {
		t.Fatal(err)
	}
	want := "requeued 1 dead samples of job rq"
	if got := strings.Count(out.String(), want); got != 2 {
		t.Errorf("output %q: want %q twice (1 by reason, then the other)", out.String(), want)
	}
	out.Reset()
	if err := runRequeue(ctx, &out, jobPath, requeueOptions{}); err != nil {
		t.Fatal(err)
	}
	if want := "job rq has no dead samples to requeue\n"; out.String() != want {
		t.Errorf("with nothing dead: %q, want %q", out.String(), want)
	}
}
