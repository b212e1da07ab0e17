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
	st, err := openStore(context.Background(), spec)
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

func TestRequeueRejected(t *testing.T) {
	dir := t.TempDir()
	jobPath := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobPath, []byte(`name: rr
endpoints: [{url: "http://127.0.0.1:1"}]
sources: [{partition: p, path: data.jsonl, prompt: prompt}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out bytes.Buffer
	for _, o := range []requeueOptions{{rule: "empty"}, {rejected: true, reason: "x"}, {rejected: true, rule: "shiny"}} {
		if err := runRequeue(ctx, &out, jobPath, o); err == nil {
			t.Errorf("requeue %+v: no error", o)
		}
	}
	spec, err := job.Load(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	var ns []store.NewSample
	for _, id := range []string{"a", "b", "c"} {
		ns = append(ns, store.NewSample{ID: id, Partition: "p", Lane: "default", Body: []byte(`{}`)})
	}
	if _, err := st.Ingest(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, "default", 3, "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	r := store.Result{Response: []byte(`{}`), FinishReason: "length"}
	for id, rule := range map[string]string{"a": "truncated", "b": "truncated", "c": "empty"} {
		if err := st.Reject(ctx, id, "w", r, rule, "evidence"); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	if err := runRequeue(ctx, &out, jobPath, requeueOptions{rejected: true, rule: "truncated"}); err != nil {
		t.Fatal(err)
	}
	if err := runRequeue(ctx, &out, jobPath, requeueOptions{rejected: true}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requeued 2 samples rejected by truncated of job rr", "requeued 1 rejected samples of job rr"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
	st, err = openStore(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	counts, err := st.Counts(ctx)
	if err != nil || len(counts) != 1 || counts[0].State != store.Pending || counts[0].N != 3 {
		t.Errorf("counts after requeue = %+v, %v; want 3 pending", counts, err)
	}
}
