package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/regen-dev/regen/internal/store"
)

// testConcurrentCompletions fires many lease transitions at once, as a
// dispatcher settling hundreds of requests does, so a backend that batches
// them (group commit) must still give every caller its own outcome: the
// holder's transitions succeed, a stranger's and a second one for the same
// sample fail with ErrNotLeased, and every success is visible once its
// call has returned.
func testConcurrentCompletions(t *testing.T, s queue) {
	const n = 400
	var in []store.NewSample
	for i := range n {
		in = append(in, sample("p", "short", fmt.Sprintf("c%04d", i)))
	}
	ingest(t, s, in)
	held := claim(t, s, "short", n, "w")
	if len(held) != n {
		t.Fatalf("claimed %d, want %d", len(held), n)
	}
	wins := winners(t, settleAtOnce(s, held))
	if len(wins) != n {
		t.Fatalf("%d samples had a successful transition, want %d", len(wins), n)
	}
	want := map[string]int{}
	for _, op := range wins {
		switch op {
		case "complete", "twice":
			want["p/short/done"]++
		case "reject":
			want["p/short/rejected"]++
		case "retry":
			want["p/short/pending"]++
		case "dead":
			want["p/short/dead"]++
		}
	}
	wantStates(t, s, want)
	rows, _ := rowsOf(t, s)
	for _, r := range rows {
		switch r.State {
		case store.Done, store.Rejected:
			if diff := cmp.Diff(result(r.ID), r.Result); diff != "" {
				t.Errorf("%s result (-want +got):\n%s", r.ID, diff)
			}
		}
		if r.Attempts != 1 {
			t.Errorf("%s: %d attempts, want 1", r.ID, r.Attempts)
		}
	}
}

// outcome is one transition a concurrent caller tried.
type outcome struct {
	id, op string
	err    error
}

// settleAtOnce settles every held sample in its own goroutine, one of
// five transitions by position; a stranger tries the same sample at the
// same time, and every tenth sample is completed twice by its holder.
func settleAtOnce(s queue, held []store.Claimed) []outcome {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		out []outcome
		wg  sync.WaitGroup
	)
	record := func(o outcome) {
		mu.Lock()
		out = append(out, o)
		mu.Unlock()
	}
	for i, c := range held {
		id := c.ID
		wg.Go(func() {
			o := outcome{id: id}
			switch i % 5 {
			case 0, 1:
				o.op, o.err = "complete", s.Complete(ctx, id, "w", result(id))
			case 2:
				o.op, o.err = "reject", s.Reject(ctx, id, "w", result(id), "rule", "bad "+id)
			case 3:
				o.op, o.err = "retry", s.Retry(ctx, id, "w", time.Now().Add(time.Hour), "503 "+id)
			case 4:
				o.op, o.err = "dead", s.DeadLetter(ctx, id, "w", "400 "+id)
			}
			record(o)
		})
		wg.Go(func() {
			record(outcome{id: id, op: "stranger", err: s.Complete(ctx, id, "intruder", result("intruder"))})
		})
		if i%10 == 0 {
			wg.Go(func() {
				record(outcome{id: id, op: "twice", err: s.Complete(ctx, id, "w", result(id))})
			})
		}
	}
	wg.Wait()
	return out
}

// winners checks that every stranger was refused and at most one
// transition per sample took, and returns the one that did per id.
func winners(t *testing.T, out []outcome) map[string]string {
	t.Helper()
	wins := map[string]string{}
	for _, o := range out {
		switch {
		case o.op == "stranger":
			if !errors.Is(o.err, store.ErrNotLeased) {
				t.Errorf("%s by a stranger: %v, want ErrNotLeased", o.id, o.err)
			}
		case o.err == nil:
			if prev, ok := wins[o.id]; ok {
				t.Errorf("%s: both %s and %s succeeded", o.id, prev, o.op)
			}
			wins[o.id] = o.op
		case !errors.Is(o.err, store.ErrNotLeased):
			t.Errorf("%s %s: %v", o.id, o.op, o.err)
		}
	}
	return wins
}
