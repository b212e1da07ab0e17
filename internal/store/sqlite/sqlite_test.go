package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "job.db"))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "job.db"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var _ = context.Background
