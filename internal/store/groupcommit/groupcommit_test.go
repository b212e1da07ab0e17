package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCoalescesAndReportsEachOutcome holds the first commit until many
// callers are queued, so the next commit must take them together, and checks
// that every caller gets its own outcome only after its batch ran.
func TestCoalescesAndReportsEachOutcome(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	committed := map[int]bool{}
	q := New(64, func(_ context.Context, batch []int) []error {
		if batch[0] == -1 {
			close(started)
			<-release // the first commit is slow
		}
		mu.Lock()
		batches = append(batches, append([]int(nil), batch...))
		errs := make([]error, len(batch))
		for i, v := range batch {
			committed[v] = true
			if v%10 == 3 {
				errs[i] = fmt.Errorf("refused %d", v)
			}
		}
		mu.Unlock()
		return errs
	})
	defer q.Close()

	first := make(chan error, 1)
	go func() { first <- q.Do(context.Background(), -1) }()
	<-started // the committer holds the first request
	const n = 40
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = q.Do(context.Background(), i)
			mu.Lock()
			defer mu.Unlock()
			if !committed[i] {
				t.Errorf("Do(%d) returned before its batch was committed", i)
			}
		})
	}
	// All 40 queued behind the slow commit.
	for len(q.in) < n {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first Do: %v", err)
	}
	for i, err := range errs {
		want := i%10 == 3
		if (err != nil) != want {
			t.Errorf("Do(%d) = %v, want error %v", i, err, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) != 2 || len(batches[1]) != n {
		sizes := []int{}
		for _, b := range batches {
			sizes = append(sizes, len(b))
		}
		t.Errorf("batch sizes %v, want [1 %d]: queued requests must share one commit", sizes, n)
	}
}

func TestCloseDrainsAndRefuses(t *testing.T) {
	var mu sync.Mutex
	seen := 0
	q := New(4, func(_ context.Context, batch []string) []error {
		mu.Lock()
		seen += len(batch)
		mu.Unlock()
		return make([]error, len(batch))
	})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := q.Do(context.Background(), fmt.Sprint(i)); err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("Do: %v", err)
			}
		})
	}
	wg.Wait()
	q.Close()
	if err := q.Do(context.Background(), "late"); !errors.Is(err, ErrClosed) {
		t.Errorf("Do after Close = %v, want ErrClosed", err)
	}
	if seen != 20 {
		t.Errorf("committed %d requests, want 20", seen)
	}
}

func TestDoHonoursContext(t *testing.T) {
	block := make(chan struct{})
	q := New(1, func(_ context.Context, batch []int) []error {
		<-block
		return make([]error, len(batch))
	})
	defer q.Close()
	defer close(block)
	go func() { _ = q.Do(context.Background(), 1) }() // occupies the committer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := q.Do(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do with an expiring context = %v, want DeadlineExceeded", err)
	}
}
