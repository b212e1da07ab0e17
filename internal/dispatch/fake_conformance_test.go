package dispatch

import (
	"testing"

	"github.com/regen-dev/regen/internal/store/storetest"
)

// TestFakeStoreConformance keeps the fake honest: it passes the queue part
// of the suite the real backends pass.
func TestFakeStoreConformance(t *testing.T) {
	storetest.RunQueue(t, func(*testing.T) storetest.QueueStore { return newFakeStore() })
}
