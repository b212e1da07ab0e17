package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/regen-dev/regen/internal/store"
)

// captureTests are the cases for hidden-state capture's table: a key is
// claimed under a fenced lease, recorded exactly once, and fails into the
// dead state only through attempts of its own.
var captureTests = []struct {
	name string
	fn   func(t *testing.T, s store.Store)
}{
	{"CaptureClaimedOnceRecordedOnce", testCaptureOnce},
	{"CaptureLostLeaseRefused", testCaptureLostLease},
	{"CaptureAttemptsAndDead", testCaptureAttempts},
	{"CaptureReleaseSpendsNothing", testCaptureRelease},
	{"CapturedFilesListedCountedUnique", testCapturedFiles},
	{"CaptureConcurrentClaimsOnce", testCaptureConcurrent},
	{"CaptureAgainForOtherInput", testCaptureInput},
	{"CaptureServerPathHandedOn", testCaptureServerPath},
	{"CaptureServerPathOfTwoKeysNeither", testCaptureServerPathShared},
	{"CaptureServerPathsLeftListed", testLeftServerPaths},
}

func ckey(id string, turn int) store.CaptureKey {
	if turn == store.WholeConversation {
		return store.CaptureKey{Key: id, SampleID: id, Turn: turn}
	}
	return store.CaptureKey{Key: fmt.Sprintf("%s/turn%d", id, turn+1), SampleID: id, Turn: turn}
}

func cfile(k store.CaptureKey, path string) store.CapturedFile {
	return store.CapturedFile{CaptureKey: k, Path: path, Bytes: 4096, SHA256: "ab12", Tokens: 17, Layers: 3,
		Hidden: 64, DType: "BF16", CapturedAt: time.Unix(1700000000, 0)}
}

func claimCapture(t *testing.T, s store.Store, k store.CaptureKey, owner string, lease time.Duration) (store.CaptureClaim, bool) {
	t.Helper()
	c, ok, err := s.ClaimCapture(context.Background(), k, owner, lease)
	if err != nil {
		t.Fatalf("ClaimCapture(%s, %s): %v", k.Key, owner, err)
	}
	return c, ok
}

func wantCaptureStates(t *testing.T, s store.Store, keys []string, want map[string]store.State) {
	t.Helper()
	states, err := s.CaptureStates(context.Background(), keys)
	if err != nil {
		t.Fatalf("CaptureStates: %v", err)
	}
	got := map[string]store.State{}
	for k, st := range states {
		got[k] = st.State
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("CaptureStates (-want +got):\n%s", d)
	}
}

func testCaptureOnce(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := ckey("a", store.WholeConversation)
	c, ok := claimCapture(t, s, k, "w1", lease)
	if !ok || c.Token == 0 || c.Attempts != 0 || c.Key != "a" || c.SampleID != "a" || c.Turn != store.WholeConversation {
		t.Fatalf("first claim = %+v, ok=%v; want a fresh lease on a", c, ok)
	}
	if _, ok := claimCapture(t, s, k, "w2", lease); ok {
		t.Fatal("a second worker claimed a capture under a live lease")
	}
	wantCaptureStates(t, s, []string{"a", "never"}, map[string]store.State{"a": store.Leased})
	must(t, s.RecordCapture(ctx, c, cfile(k, "hidden_states/a.safetensors")))
	wantErr(t, "RecordCapture twice", s.RecordCapture(ctx, c, cfile(k, "hidden_states/a.safetensors")), store.ErrNotLeased)
	wantErr(t, "ConfirmCapture of a captured key", s.ConfirmCapture(ctx, c, lease), store.ErrNotLeased)
	if _, ok := claimCapture(t, s, k, "w2", lease); ok {
		t.Fatal("a captured key was claimed again")
	}
	if ok, err := s.RequeueCaptured(ctx, "never", "missing"); err != nil || ok {
		t.Errorf("RequeueCaptured of a key never captured = %v, %v; want false", ok, err)
	}
	if ok, err := s.RequeueCaptured(ctx, "a", "recheck: missing"); err != nil || !ok {
		t.Fatalf("RequeueCaptured(a) = %v, %v; want true", ok, err)
	}
	wantCaptureStates(t, s, []string{"a"}, map[string]store.State{"a": store.Pending})
	again, ok := claimCapture(t, s, k, "w2", lease)
	if !ok || again.Attempts != 0 {
		t.Fatalf("claim after RequeueCaptured = %+v, %v; want a fresh lease", again, ok)
	}
	must(t, s.RecordCapture(ctx, again, cfile(k, "hidden_states/a.safetensors")))
	wantCaptureStates(t, s, []string{"a"}, map[string]store.State{"a": store.Done})
}

func testCaptureLostLease(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := ckey("a", 2)
	old, ok := claimCapture(t, s, k, "w1", -time.Second) // a lease that already ended
	if !ok {
		t.Fatal("first claim refused")
	}
	c, ok := claimCapture(t, s, k, "w1", lease)
	if !ok || c.Token == old.Token {
		t.Fatalf("claim after the lease ended = %+v, ok=%v; want a new token (old %d)", c, ok, old.Token)
	}
	wantErr(t, "RecordCapture under the lost lease", s.RecordCapture(ctx, old, cfile(k, "h/a.safetensors")), store.ErrNotLeased)
	wantErr(t, "FailCapture under the lost lease", s.FailCapture(ctx, old, "nan: x", true), store.ErrNotLeased)
	wantErr(t, "ConfirmCapture under the lost lease", s.ConfirmCapture(ctx, old, lease), store.ErrNotLeased)
	must(t, s.ConfirmCapture(ctx, c, lease))
	must(t, s.ReleaseCapture(ctx, old)) // no error, and no effect
	wantCaptureStates(t, s, []string{k.Key}, map[string]store.State{k.Key: store.Leased})
	must(t, s.RecordCapture(ctx, c, cfile(k, "h/a.safetensors")))

	// A lease kept alive by ExtendCaptureLeases is not taken.
	k2 := ckey("b", store.WholeConversation)
	if _, ok := claimCapture(t, s, k2, "w1", -time.Second); !ok {
		t.Fatal("claim of b refused")
	}
	must(t, s.ExtendCaptureLeases(ctx, "w1", lease))
	if _, ok := claimCapture(t, s, k2, "w2", lease); ok {
		t.Fatal("a lease extended by its owner was taken")
	}
}

func testCaptureAttempts(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := ckey("a", store.WholeConversation)
	c, _ := claimCapture(t, s, k, "w1", lease)
	must(t, s.FailCapture(ctx, c, "nan: hidden_states[3,0,7]", false))
	if _, ok := claimCapture(t, s, k, "w2", lease); ok {
		t.Fatal("a failed attempt gave up the lease")
	}
	must(t, s.ReleaseCapture(ctx, c))
	c, ok := claimCapture(t, s, k, "w2", lease)
	if !ok || c.Attempts != 1 || c.LastError != "nan: hidden_states[3,0,7]" {
		t.Fatalf("claim after one failure = %+v, ok=%v; want attempts 1 and the evidence", c, ok)
	}
	must(t, s.FailCapture(ctx, c, "truncated: metadata incomplete buffer", true))
	if _, ok := claimCapture(t, s, k, "w3", lease); ok {
		t.Fatal("a dead capture was claimed")
	}
	n := ckey("b", store.WholeConversation)
	cb, _ := claimCapture(t, s, n, "w1", lease)
	must(t, s.FailCapture(ctx, cb, "shape: tokens 5, want 6", false))
	got, err := s.CaptureFailures(ctx, 0)
	must(t, err)
	want := []store.CaptureFailure{
		{CaptureKey: k, State: store.Dead, Attempts: 2, LastError: "truncated: metadata incomplete buffer"},
		{CaptureKey: n, State: store.Leased, Attempts: 1, LastError: "shape: tokens 5, want 6"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("CaptureFailures (-want +got):\n%s", d)
	}
	if got, err := s.CaptureFailures(ctx, 1); err != nil || len(got) != 1 || got[0].Key != "a" {
		t.Errorf("CaptureFailures(1) = %+v, %v; want the dead one", got, err)
	}
	counts, err := s.CaptureCounts(ctx)
	must(t, err)
	if counts != (store.CaptureCounts{Dead: 1, Leased: 1}) {
		t.Errorf("CaptureCounts = %+v, want 1 dead, 1 leased", counts)
	}
	if n, err := s.RequeueDeadCaptures(ctx, "nan"); err != nil || n != 0 {
		t.Errorf("RequeueDeadCaptures(nan) = %d, %v; want 0", n, err)
	}
	if n, err := s.RequeueDeadCaptures(ctx, "truncated"); err != nil || n != 1 {
		t.Errorf("RequeueDeadCaptures(truncated) = %d, %v; want 1", n, err)
	}
	if c, ok := claimCapture(t, s, k, "w3", lease); !ok || c.Attempts != 0 {
		t.Errorf("claim after requeue = %+v, ok=%v; want attempts reset", c, ok)
	}
}

func testCaptureRelease(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		owner := "w1"
		if id == "c" {
			owner = "w2"
		}
		claimCapture(t, s, ckey(id, store.WholeConversation), owner, lease)
	}
	if n, err := s.ReleaseCaptures(ctx, "w1"); err != nil || n != 2 {
		t.Fatalf("ReleaseCaptures(w1) = %d, %v; want 2", n, err)
	}
	wantCaptureStates(t, s, []string{"a", "b", "c"},
		map[string]store.State{"a": store.Pending, "b": store.Pending, "c": store.Leased})
	if n, err := s.ReleaseCaptures(ctx, ""); err != nil || n != 1 {
		t.Fatalf(`ReleaseCaptures("") = %d, %v; want 1`, n, err)
	}
	c, ok := claimCapture(t, s, ckey("c", store.WholeConversation), "w3", lease)
	if !ok || c.Attempts != 0 {
		t.Fatalf("claim after release = %+v, ok=%v; want attempts 0", c, ok)
	}
	counts, err := s.CaptureCounts(ctx)
	must(t, err)
	if counts != (store.CaptureCounts{Pending: 2, Leased: 1}) {
		t.Errorf("CaptureCounts = %+v, want 2 pending, 1 leased", counts)
	}
}

func testCapturedFiles(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 1003 // more than one page
	var want []store.CapturedFile
	for i := range n {
		k := ckey(fmt.Sprintf("s%04d", i/3), i%3)
		c, ok := claimCapture(t, s, k, "w", lease)
		if !ok {
			t.Fatalf("claim %s refused", k.Key)
		}
		f := cfile(k, fmt.Sprintf("h/%s.safetensors", k.Key))
		f.Bytes, f.Tokens = int64(1000+i), 10+i
		must(t, s.RecordCapture(ctx, c, f))
		want = append(want, f)
	}
	var got []store.CapturedFile
	must(t, s.EachCapturedFile(ctx, func(f store.CapturedFile) error {
		got = append(got, f)
		return nil
	}))
	if d := cmp.Diff(want, got, cmpopts.EquateApproxTime(time.Millisecond)); d != "" {
		t.Errorf("EachCapturedFile (-want +got):\n%s", d)
	}
	stop := errors.New("stop")
	calls := 0
	err := s.EachCapturedFile(ctx, func(store.CapturedFile) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("EachCapturedFile with a failing fn: %v after %d calls; want stop after 1", err, calls)
	}
	var bytes, tokens int64
	for _, f := range want {
		bytes += f.Bytes
		tokens += int64(f.Tokens)
	}
	counts, err := s.CaptureCounts(ctx)
	must(t, err)
	if counts != (store.CaptureCounts{Captured: n, Bytes: bytes, Tokens: tokens}) {
		t.Errorf("CaptureCounts = %+v, want %d captured, %d bytes, %d tokens", counts, n, bytes, tokens)
	}
	// One file is never listed for two keys.
	k := ckey("other", store.WholeConversation)
	c, _ := claimCapture(t, s, k, "w", lease)
	if err := s.RecordCapture(ctx, c, cfile(k, want[0].Path)); err == nil || errors.Is(err, store.ErrNotLeased) {
		t.Errorf("RecordCapture of a path already listed: err = %v, want a uniqueness error", err)
	}
	wantCaptureStates(t, s, []string{"other"}, map[string]store.State{"other": store.Leased})
}

func testCaptureConcurrent(t *testing.T, s store.Store) {
	const workers, keys = 6, 40
	var mu sync.Mutex
	holders := map[string][]string{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for i := range keys {
				k := ckey(fmt.Sprintf("k%02d", i), store.WholeConversation)
				_, ok, err := s.ClaimCapture(context.Background(), k, owner, lease)
				if err != nil {
					t.Errorf("ClaimCapture: %v", err)
					return
				}
				if ok {
					mu.Lock()
					holders[k.Key] = append(holders[k.Key], owner)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(holders) != keys {
		t.Errorf("%d keys claimed, want %d", len(holders), keys)
	}
	for k, h := range holders {
		if len(h) != 1 {
			t.Errorf("key %s claimed by %v at once", k, h)
		}
	}
}

// testCaptureInput: a key captured (or dead) for one input is claimed
// again, at zero attempts, for another (the sample was generated again),
// and never for the same one; the input is kept and listed.
func testCaptureInput(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := ckey("a", store.WholeConversation)
	k.Input = "in1"
	c, _ := claimCapture(t, s, k, "w", lease)
	must(t, s.RecordCapture(ctx, c, cfile(k, "h/a.safetensors")))
	if _, ok := claimCapture(t, s, k, "w", lease); ok {
		t.Fatal("a key captured for this input was claimed again")
	}
	states, err := s.CaptureStates(ctx, []string{"a"})
	must(t, err)
	if states["a"] != (store.CaptureState{State: store.Done, Input: "in1"}) {
		t.Errorf("CaptureStates = %+v, want done for in1", states)
	}
	k.Input = "in2"
	c2, ok := claimCapture(t, s, k, "w", lease)
	if !ok || c2.Token == c.Token || c2.Attempts != 0 {
		t.Fatalf("claim for another input = %+v, ok=%v; want a new lease", c2, ok)
	}
	must(t, s.FailCapture(ctx, c2, "nan: x", true))
	if _, ok := claimCapture(t, s, k, "w", lease); ok {
		t.Fatal("a key dead for this input was claimed again")
	}
	k.Input = "in3"
	c3, ok := claimCapture(t, s, k, "w", lease)
	if !ok || c3.Attempts != 0 || c3.LastError != "" {
		t.Fatalf("claim of a dead key for another input = %+v, ok=%v; want attempts and evidence reset", c3, ok)
	}
	f := cfile(k, "h/a.safetensors") // the same stable name, now the new input's file
	must(t, s.RecordCapture(ctx, c3, f))
	var got []store.CapturedFile
	must(t, s.EachCapturedFile(ctx, func(f store.CapturedFile) error { got = append(got, f); return nil }))
	if len(got) != 1 || got[0].Input != "in3" {
		t.Errorf("captured files %+v, want one for in3", got)
	}
	// A row recorded without an input matches any.
	old := ckey("b", store.WholeConversation)
	cb, _ := claimCapture(t, s, old, "w", lease)
	must(t, s.RecordCapture(ctx, cb, cfile(old, "h/b.safetensors")))
	old.Input = "in1"
	if _, ok := claimCapture(t, s, old, "w", lease); ok {
		t.Error("a key recorded without an input was claimed again")
	}
}

// claimServerPath claims k and checks the server path the claim hands on.
func claimServerPath(t *testing.T, s store.Store, k store.CaptureKey, owner, want string) store.CaptureClaim {
	t.Helper()
	c, ok := claimCapture(t, s, k, owner, lease)
	if !ok {
		t.Fatalf("claim of %s by %s refused", k.Key, owner)
	}
	if c.ServerPath != want {
		t.Fatalf("claim of %s by %s: ServerPath %q, want %q", k.Key, owner, c.ServerPath, want)
	}
	return c
}

// testCaptureServerPath: the server path noted under a lease is handed to
// the key's next holder (after a lapsed lease, a release), only under the
// noting lease, and cleared once the key is recorded or failed.
func testCaptureServerPath(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := ckey("a", store.WholeConversation)
	k.Input = "in1"
	const p1, p2 = "/srv/out/req-1.safetensors", "/srv/out/req-2.safetensors"
	first, _ := claimCapture(t, s, k, "w1", -time.Second) // killed: its lease ends
	if first.ServerPath != "" {
		t.Fatalf("first claim hands on %q", first.ServerPath)
	}
	must(t, s.NoteCaptureServerPath(ctx, first, p1))
	c := claimServerPath(t, s, k, "w2", p1)
	wantErr(t, "NoteCaptureServerPath under the lost lease", s.NoteCaptureServerPath(ctx, first, p2), store.ErrNotLeased)
	must(t, s.ReleaseCapture(ctx, c)) // a release keeps the path: nothing settled it
	c = claimServerPath(t, s, k, "w2", p1)
	must(t, s.NoteCaptureServerPath(ctx, c, p2))
	_, err := s.ReleaseCaptures(ctx, "")
	must(t, err)
	c = claimServerPath(t, s, k, "w3", p2)
	must(t, s.FailCapture(ctx, c, "nan: x", false)) // the failing worker removed the file itself
	must(t, s.ReleaseCapture(ctx, c))
	c = claimServerPath(t, s, k, "w3", "")
	must(t, s.NoteCaptureServerPath(ctx, c, p1))
	must(t, s.RecordCapture(ctx, c, cfile(k, "h/a.safetensors")))
	k.Input = "in2" // generated again: claimed again, with nothing to remove
	c = claimServerPath(t, s, k, "w3", "")
	must(t, s.NoteCaptureServerPath(ctx, c, p2))
	must(t, s.FailCapture(ctx, c, "nan: x", true))
	k.Input = "in3"
	claimServerPath(t, s, k, "w3", "")
}

// testCaptureServerPathShared: a path two keys' rows name is handed to
// neither (it may be the other's file in flight), and a path another key
// noted is never handed to this one.
func testCaptureServerPathShared(t *testing.T, s store.Store) {
	ctx := context.Background()
	a, b, other := ckey("a", 0), ckey("b", 0), ckey("c", 0)
	const p, q = "/srv/out/same.safetensors", "/srv/out/c.safetensors"
	ca, _ := claimCapture(t, s, a, "w1", -time.Second)
	cb, _ := claimCapture(t, s, b, "w1", -time.Second)
	co, _ := claimCapture(t, s, other, "w1", lease)
	must(t, s.NoteCaptureServerPath(ctx, ca, p))
	must(t, s.NoteCaptureServerPath(ctx, cb, p))
	must(t, s.NoteCaptureServerPath(ctx, co, q))
	claimServerPath(t, s, a, "w2", "")
	claimServerPath(t, s, b, "w2", "")
	if _, ok := claimCapture(t, s, other, "w2", lease); ok {
		t.Fatal("a live lease was taken")
	}
}

// testLeftServerPaths: the paths unleased rows name alone are listed for
// a sole worker's start; a leased row's, or one two rows name, are not;
// a cleared path is listed no more, and clearing a path the row no longer
// names changes nothing.
func testLeftServerPaths(t *testing.T, s store.Store) {
	ctx := context.Background()
	note := func(k store.CaptureKey, l time.Duration, p string) store.CaptureClaim {
		c, ok := claimCapture(t, s, k, "w1", l)
		if !ok {
			t.Fatalf("claim of %s refused", k.Key)
		}
		must(t, s.NoteCaptureServerPath(ctx, c, p))
		return c
	}
	note(ckey("a", 0), lease, "/srv/a.safetensors")
	note(ckey("b", 0), lease, "/srv/same.safetensors")
	note(ckey("c", 0), lease, "/srv/same.safetensors")
	_, err := s.ReleaseCaptures(ctx, "")
	must(t, err)
	note(ckey("d", 0), lease, "/srv/d.safetensors") // leased: its holder settles it
	got, err := s.LeftServerPaths(ctx)
	must(t, err)
	want := map[string]string{ckey("a", 0).Key: "/srv/a.safetensors"}
	if !cmp.Equal(got, want) {
		t.Fatalf("LeftServerPaths = %v, want %v", got, want)
	}
	must(t, s.ClearServerPath(ctx, ckey("a", 0).Key, "/srv/other.safetensors"))
	if got, err := s.LeftServerPaths(ctx); err != nil || len(got) != 1 {
		t.Fatalf("after clearing a path the row does not name: %v, %v", got, err)
	}
	must(t, s.ClearServerPath(ctx, ckey("a", 0).Key, "/srv/a.safetensors"))
	must(t, s.ClearServerPath(ctx, ckey("d", 0).Key, "/srv/d.safetensors")) // leased: kept
	if got, err := s.LeftServerPaths(ctx); err != nil || len(got) != 0 {
		t.Fatalf("after clearing: %v, %v; want none", got, err)
	}
	claimServerPath(t, s, ckey("a", 0), "w2", "")
}
