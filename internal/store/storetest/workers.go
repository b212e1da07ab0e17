package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// Many workers and big jobs: per-worker heartbeats, events tagged by worker,
// named locks, the ingest manifest and Info.

func testHeartbeatsPerWorker(t *testing.T, s store.Store) {
	ctx := context.Background()
	got, err := s.Heartbeats(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("Heartbeats on an empty store = %v, %v; want none", got, err)
	}
	base := time.Date(2025, 3, 1, 10, 0, 0, 987654321, time.UTC)
	w1 := store.Heartbeat{Owner: "gpu01-11-a", PID: 11, Host: "gpu01", Time: base.Add(2 * time.Second), Started: base, Counters: []byte(`{"w":1}`)}
	w2 := store.Heartbeat{Owner: "gpu02-22-b", PID: 22, Host: "gpu02", Time: base.Add(3 * time.Second), Started: base}
	w3 := store.Heartbeat{Owner: "gpu03-33-c", PID: 33, Host: "gpu03", Time: base.Add(time.Second), Started: base, Counters: []byte(`{"w":3}`)}
	for _, hb := range []store.Heartbeat{w1, w2, w3} {
		must(t, s.PutHeartbeat(ctx, hb))
	}
	// w1 beats again: its row is replaced, not added.
	w1.Time, w1.Counters = base.Add(5*time.Second), []byte(`{"w":1,"again":true}`)
	must(t, s.PutHeartbeat(ctx, w1))

	got, err = s.Heartbeats(ctx)
	if err != nil {
		t.Fatalf("Heartbeats: %v", err)
	}
	if diff := cmp.Diff([]store.Heartbeat{w1, w2, w3}, got); diff != "" {
		t.Errorf("Heartbeats, newest first (-want +got):\n%s", diff)
	}
	last, ok, err := s.LastHeartbeat(ctx)
	if err != nil || !ok {
		t.Fatalf("LastHeartbeat: ok=%v err=%v", ok, err)
	}
	if diff := cmp.Diff(w1, last); diff != "" {
		t.Errorf("LastHeartbeat is the newest of all workers (-want +got):\n%s", diff)
	}
}

func testEventsTaggedByWorker(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := time.Date(2025, 3, 1, 10, 0, 0, 5, time.UTC)
	want := []store.Event{
		{Time: at.Add(time.Second), Kind: "takeover", Subject: "job", Evidence: "released 3", Worker: "gpu02-22-b"},
		{Time: at, Kind: "endpoint_state", Subject: "http://127.0.0.1:30000", State: "DOWN", Worker: "gpu01-11-a"},
	}
	must(t, s.AddEvent(ctx, want[1]))
	must(t, s.AddEvent(ctx, want[0]))
	got, err := s.Events(ctx, 0)
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

func testTryLock(t *testing.T, s store.Store) {
	ctx := context.Background()
	unlockA, ok, err := s.TryLock(ctx, "export")
	if err != nil || !ok {
		t.Fatalf("TryLock(export) on a free lock = %v, %v; want ok", ok, err)
	}
	if _, ok, err := s.TryLock(ctx, "export"); err != nil || ok {
		t.Fatalf("TryLock(export) while held = %v, %v; want not ok", ok, err)
	}
	unlockB, ok, err := s.TryLock(ctx, "ingest:/data/a.jsonl")
	if err != nil || !ok {
		t.Fatalf("TryLock of another name = %v, %v; want ok", ok, err)
	}
	must(t, unlockA())
	unlockA, ok, err = s.TryLock(ctx, "export")
	if err != nil || !ok {
		t.Fatalf("TryLock(export) after unlock = %v, %v; want ok", ok, err)
	}
	must(t, unlockA())
	must(t, unlockB())

	// Many contenders at once: exactly one wins.
	var mu sync.Mutex
	var wg sync.WaitGroup
	winners := 0
	var unlocks []func() error
	for range 8 {
		wg.Go(func() {
			unlock, ok, err := s.TryLock(ctx, "race")
			if err != nil {
				t.Errorf("TryLock(race): %v", err)
				return
			}
			if ok {
				mu.Lock()
				winners++
				unlocks = append(unlocks, unlock)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if winners != 1 {
		t.Errorf("%d of 8 concurrent TryLock calls won the same lock, want 1", winners)
	}
	for _, u := range unlocks {
		must(t, u())
	}
}

func testSourceFiles(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, ok, err := s.SourceFile(ctx, "p", "/data/a.jsonl"); err != nil || ok {
		t.Fatalf("SourceFile on an empty store: ok=%v err=%v, want false, nil", ok, err)
	}
	mod := time.Date(2025, 3, 1, 10, 0, 0, 123456789, time.UTC)
	a := store.SourceFile{Partition: "p", Path: "/data/a.jsonl", Size: 1 << 33, ModTime: mod, Fingerprint: "fp1", Rows: 10, Bad: 1}
	other := store.SourceFile{Partition: "q", Path: "/data/a.jsonl", Size: 5, ModTime: mod, Fingerprint: "fp-q", Rows: 1, Complete: true}
	must(t, s.PutSourceFile(ctx, a))
	must(t, s.PutSourceFile(ctx, other))
	a.Rows, a.Complete = 12, true
	must(t, s.PutSourceFile(ctx, a))
	for _, want := range []store.SourceFile{a, other} {
		got, ok, err := s.SourceFile(ctx, want.Partition, want.Path)
		if err != nil || !ok {
			t.Fatalf("SourceFile(%s, %s): ok=%v err=%v", want.Partition, want.Path, ok, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("SourceFile(%s, %s) (-want +got):\n%s", want.Partition, want.Path, diff)
		}
	}
	if _, ok, err := s.SourceFile(ctx, "p", "/data/b.jsonl"); err != nil || ok {
		t.Errorf("SourceFile of an unrecorded path: ok=%v err=%v, want false, nil", ok, err)
	}
}

func testInfo(t *testing.T, s store.Store) {
	if info := s.Info(); info.Backend == "" || info.Location == "" {
		t.Errorf("Info() = %+v, want a backend name and a location", info)
	}
}

func testReleaseOwnerExcept(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a", "b", "c", "d", "e"))
	claim(t, s, "short", 4, "w")  // a b c d
	claim(t, s, "short", 1, "w2") // e
	must(t, s.Retry(ctx, "d", "w", time.Now().Add(time.Hour), "503"))
	n, err := s.ReleaseOwnerExcept(ctx, "w", []string{"a", "zz"})
	if err != nil || n != 2 {
		t.Fatalf("ReleaseOwnerExcept(w, keep a) = %d, %v; want 2 (b and c)", n, err)
	}
	wantStates(t, s, map[string]int{"p/short/leased": 2, "p/short/pending": 3})
	if err := s.Complete(ctx, "a", "w", result("a")); err != nil {
		t.Errorf("Complete of a kept sample: %v", err)
	}
	if err := s.Complete(ctx, "e", "w2", result("e")); err != nil {
		t.Errorf("Complete of another owner's sample: %v", err)
	}
	// Released without spending attempts; d keeps its retry's attempt.
	got := claim(t, s, "short", 10, "w3")
	if diff := cmp.Diff([]string{"b", "c"}, ids(got)); diff != "" {
		t.Errorf("claimable after the release (-want +got):\n%s", diff)
	}
	for _, c := range got {
		if c.Attempts != 0 {
			t.Errorf("%s: %d attempts, want 0", c.ID, c.Attempts)
		}
	}
	if n, err := s.ReleaseOwnerExcept(ctx, "w3", nil); err != nil || n != 2 {
		t.Errorf("ReleaseOwnerExcept(w3, nothing kept) = %d, %v; want 2", n, err)
	}
}
