package dispatch

import (
	"testing"

	"github.com/regen-dev/regen/internal/store"
	"github.com/regen-dev/regen/internal/store/storetest"
)

// TestFakeStoreConformance keeps the fake honest: it passes the same suite
// as the real backends.
func TestFakeStoreConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Store { return newFakeStore() })
}
