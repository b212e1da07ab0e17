package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store"
)

// TestWatchWaitsForTheFirstRun (issue 30 item 8): `regen watch` started
// before the job's first run says that it waits for a runner and opens
// the store once the run creates it; interrupted before, it exits 2.
func TestWatchWaitsForTheFirstRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	src := "name: early\nsources: [{partition: B1, path: p.jsonl, prompt: q}]\nendpoints: [{url: \"http://127.0.0.1:9\"}]\n"
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, noStore := openExisting(ctx, spec, "it was never run")
	if !errors.Is(noStore, store.ErrNoStore) {
		t.Fatalf("open before any run = %v, want ErrNoStore", noStore)
	}

	// Interrupted while waiting: exit 2, the message said why it waited.
	var msgs lockedBuffer
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = waitForRunner(short, spec, "job.yaml", &msgs, noStore, 20*time.Millisecond)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Errorf("interrupted wait = %v, want exit 2", err)
	}
	if want := "waiting for a runner to start it (`regen run job.yaml`)"; !strings.Contains(msgs.String(), want) {
		t.Errorf("messages lack %q:\n%s", want, msgs.String())
	}

	// A run creates the store while watch waits: watch opens it.
	var later lockedBuffer
	created := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		st, err := openStore(ctx, spec)
		if err == nil {
			err = st.Close()
		}
		created <- err
	}()
	st, err := waitForRunner(ctx, spec, "job.yaml", &later, noStore, 20*time.Millisecond)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("wait with a run starting = %v, want the store", err)
	}
	defer st.Close()
	if !strings.Contains(later.String(), "has a store now; watching") {
		t.Errorf("messages lack that watching began:\n%s", later.String())
	}
}
