package sqlite

import (
	"path/filepath"
	"sync"
	"testing"
)

// TestConcurrentFirstOpen: processes that open a new store at the same
// moment (regen run creating it, regen status or watch looking at it) all
// succeed; the schema is created once.
func TestConcurrentFirstOpen(t *testing.T) {
	for round := range 20 {
		path := filepath.Join(t.TempDir(), "s.db")
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				s, err := Open(path)
				if err == nil {
					err = s.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: opener %d of a new store: %v", round, i, err)
			}
		}
	}
}
