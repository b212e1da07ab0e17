package sqlite

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// Claim keeps the driver's slices of bodies and answers rather than copying
// them (blobColumn): each must still hold its own bytes after the rows that
// returned it, and later statements, have moved on. Sizes span SQLite's
// overflow pages and the driver's reads.
func TestScannedBlobsOutliveTheirRows(t *testing.T) {
	s, _ := openTemp(t, Options{})
	ctx := context.Background()
	fill := func(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }
	const n = 12
	var ns []store.NewSample
	for i := range n {
		ns = append(ns, store.NewSample{ID: fmt.Sprintf("s%02d", i), Partition: "p", Lane: "short",
			Body: fill('a'+byte(i), 100+i*9000), Origin: fmt.Sprintf("p.jsonl:%d", i+1)})
	}
	if _, err := s.Ingest(ctx, ns); err != nil {
		t.Fatal(err)
	}
	first, err := s.Claim(ctx, "short", n, "o", time.Hour)
	if err != nil || len(first) != n {
		t.Fatalf("claim: %d claimed, %v", len(first), err)
	}
	answers := map[string][]byte{}
	for i, c := range first {
		answers[c.ID] = fill('A'+byte(i), 50+i*7000)
		r := store.Result{Response: answers[c.ID], FinishReason: "stop", Endpoint: "e", Turn: 0}
		if err := s.CompleteTurn(ctx, c.ID, "o", r, ""); err != nil {
			t.Fatal(err)
		}
	}
	next, err := s.Claim(ctx, "short", n, "o", time.Hour) // reads the bodies again, and every answer
	if err != nil || len(next) != n {
		t.Fatalf("claim of the next turns: %d claimed, %v", len(next), err)
	}
	want := map[string][]byte{}
	for _, smp := range ns {
		want[smp.ID] = smp.Body
	}
	for _, c := range append(first, next...) {
		if !bytes.Equal(c.Body, want[c.ID]) {
			t.Errorf("sample %s turn %d: body of %d bytes changed after its row (want %d bytes of %q)", c.ID, c.Turn, len(c.Body), len(want[c.ID]), want[c.ID][0])
		}
	}
	for _, c := range next {
		if len(c.Prior) != 1 || !bytes.Equal(c.Prior[0].Response, answers[c.ID]) {
			t.Errorf("sample %s: stored answer changed after its row", c.ID)
		}
	}
}
