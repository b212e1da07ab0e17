package storetest

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
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

// testClaimKept: ClaimKept hands a later turn over Kept, without its body
// and earlier answers, only when the caller names that very turn and the
// lease that stored the turn before was its last; every other sample
// comes back whole, as Claim hands it. Where the backend keeps lease
// tokens, a claim by anyone in between (the sample released or its lease
// lost and claimed elsewhere) makes it whole again.
func testClaimKept(t *testing.T, s queue) {
	ctx := context.Background()
	in := samples("p", "short", "a", "b", "c", "d", "e")
	ingest(t, s, in)
	body := map[string][]byte{}
	for _, smp := range in {
		body[smp.ID] = smp.Body
	}
	tokens := map[string]int64{}
	for _, c := range claim(t, s, "short", 4, "w1") { // e stays at its first turn
		tokens[c.ID] = c.Token
		must(t, s.CompleteTurn(ctx, c.ID, "w1", turnResult(c.ID, 0, "stop", 10, 5, 0), ""))
	}
	// a is claimed by another worker and given back before w1 claims it.
	if got := claimOne(t, s, "short", "w2", "a"); got.ID != "a" {
		t.Fatalf("setup: w2 claimed %s", got.ID)
	}
	must(t, s.Release(ctx, []string{"a"}, "w2"))
	tokenStore := tokens["a"] != 0
	kept := []store.Kept{
		{ID: "a", Turn: 1, Token: tokens["a"]}, // claimed by w2 since
		{ID: "b", Turn: 1, Token: tokens["b"]}, // as w1 left it
		{ID: "c", Turn: 2, Token: tokens["c"]}, // another turn
		{ID: "e", Turn: 0},                     // a first turn is always whole
	}
	got, err := s.ClaimKept(ctx, "short", 10, "w1", lease, kept)
	if err != nil {
		t.Fatalf("ClaimKept: %v", err)
	}
	if len(got) != 5 {
		t.Fatalf("ClaimKept claimed %v, want all 5", ids(got))
	}
	for _, c := range got {
		wantKept := c.ID == "b" || (c.ID == "a" && !tokenStore)
		if c.Kept != wantKept {
			t.Errorf("%s handed over Kept=%v, want %v", c.ID, c.Kept, wantKept)
		}
		if c.Kept {
			if c.Body != nil || c.Prior != nil || c.Turn != 1 {
				t.Errorf("%s Kept with turn %d, body %q, %d earlier answers; want turn 1 and neither", c.ID, c.Turn, c.Body, len(c.Prior))
			}
			continue
		}
		if !bytes.Equal(c.Body, body[c.ID]) || len(c.Prior) != c.Turn {
			t.Errorf("%s handed over with body %q and %d earlier answers at turn %d; want its body and every answer", c.ID, c.Body, len(c.Prior), c.Turn)
		}
	}
}
