package storetest

import (
	"context"
	"slices"
	"testing"
	"time"
)

func testClaimLaterTurnsFirst(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "long", "e"))
	ingest(t, s, samples("p", "short", "a", "b", "c", "d", "f"))
	if got := ids(claim(t, s, "short", 3, "w")); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("first claim %v, want [a b c]", got)
	}
	must(t, s.Release(ctx, []string{"a"}, "w"))
	must(t, s.Retry(ctx, "c", "w", time.Now().Add(-time.Millisecond), "429"))
	must(t, s.CompleteTurn(ctx, "b", "w", turnResult("b", 0, "stop", 10, 5, 0), ""))
	// b's second turn comes before a (older, never answered), c (a retry
	// now due) and d.
	if got := ids(claim(t, s, "short", 2, "w")); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("claim after b's first turn %v, want [b a]", got)
	}
	must(t, s.CompleteTurn(ctx, "b", "w", turnResult("b", 1, "stop", 20, 5, 0), "long"))
	// In another lane too: b's third turn before e, ingested first.
	if got := ids(claim(t, s, "long", 2, "w")); !slices.Equal(got, []string{"b", "e"}) {
		t.Errorf("long lane claim %v, want [b e]", got)
	}
	if got := ids(claim(t, s, "short", 5, "w")); !slices.Equal(got, []string{"c", "d", "f"}) {
		t.Errorf("last claim %v, want [c d f] (oldest first)", got)
	}
}

func testPriorEndpoints(t *testing.T, s queue) {
	ctx := context.Background()
	ingest(t, s, samples("p", "short", "a"))
	eps := []string{"http://127.0.0.1:30001", "http://127.0.0.1:30002"}
	for turn, ep := range eps {
		c := claimOne(t, s, "short", "w1", "a")
		r := turnResult("a", turn, "stop", 10, 5, 0)
		r.Endpoint = ep
		must(t, s.CompleteTurn(ctx, c.ID, "w1", r, ""))
	}
	// Another worker after the first one's lease ran out (a killed runner).
	claimOne(t, s, "short", "w1", "a")
	if n, err := s.ExpireLeases(ctx, time.Now().Add(2*lease)); err != nil || n != 1 {
		t.Fatalf("ExpireLeases = %d, %v; want 1", n, err)
	}
	c := claimOne(t, s, "short", "w2", "a")
	var got []string
	for _, r := range c.Prior {
		got = append(got, r.Endpoint)
	}
	if c.Turn != 2 || !slices.Equal(got, eps) {
		t.Errorf("turn %d, earlier turns' endpoints %v; want turn 2, %v", c.Turn, got, eps)
	}
}
